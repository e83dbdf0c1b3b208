/* Learning-rate schedule and gradient clipping factor (see optim.h). */
#include "src/engine/optim.h"

#include <math.h>

lr_schedule lr_schedule_job(float lr, float min_lr, int warmup_steps, int total_steps) {
    return (lr_schedule){lr, min_lr, warmup_steps, total_steps, warmup_steps, lr};
}

lr_schedule lr_schedule_extend(float lr, float min_lr, int warmup_steps, int total_steps,
                               int first, float last_lr) {
    lr_schedule s = lr_schedule_job(lr, min_lr, warmup_steps, total_steps);
    if (first > warmup_steps) {
        s.decay_from = first - 1;
        s.decay_lr = last_lr;
    }
    return s;
}

float lr_at(const lr_schedule *sch, int s) {
    if (sch->warmup_steps > 0 && s < sch->warmup_steps)
        return sch->lr * (float)(s + 1) / (float)sch->warmup_steps;
    int decay_steps = sch->total_steps - sch->decay_from;
    if (decay_steps <= 1) return sch->decay_lr;
    double progress = (double)(s - sch->decay_from) / (double)(decay_steps - 1);
    if (progress > 1) progress = 1;
    if (progress < 0) progress = 0;
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)(sch->min_lr + (sch->decay_lr - sch->min_lr) * cosine);
}

float clip_factor(double grad_norm, float max_norm) {
    if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
    return (float)(max_norm / (grad_norm + 1e-6));
}
