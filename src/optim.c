/* Learning-rate schedule and gradient clipping factor (see optim.h). */
#include "src/optim.h"

#include <math.h>

float lr_at(const lr_schedule *sch, int s) {
    if (sch->warmup_steps > 0 && s < sch->warmup_steps)
        return sch->lr * (float)(s + 1) / (float)sch->warmup_steps;
    int decay_steps = sch->total_steps - sch->warmup_steps;
    if (decay_steps <= 1) return sch->lr;
    double progress = (double)(s - sch->warmup_steps) / (double)(decay_steps - 1);
    if (progress > 1) progress = 1;
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)(sch->min_lr + (sch->lr - sch->min_lr) * cosine);
}

float clip_factor(double grad_norm, float max_norm) {
    if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
    return (float)(max_norm / (grad_norm + 1e-6));
}
