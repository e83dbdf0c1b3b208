/* Optimizer hyper-parameters, the learning-rate schedule (linear warm-up, cosine
 * decay) and the gradient-clipping factor. The AdamW arithmetic is in the ops table. */
#ifndef SHLM_OPTIM_H
#define SHLM_OPTIM_H

typedef struct adamw_hparams {
    float beta1, beta2, eps, weight_decay;
} adamw_hparams;

typedef struct lr_schedule {
    float lr, min_lr;
    int warmup_steps, total_steps;
} lr_schedule;

/* Learning rate of 0-based step s: (s+1)/warmup·lr during warm-up, then cosine from
 * lr down to min_lr at the last step. */
float lr_at(const lr_schedule *sch, int s);

/* Factor to multiply gradients by so their global L2 norm is at most max_norm
 * (1 when max_norm <= 0 or the norm is already below it). */
float clip_factor(double grad_norm, float max_norm);

#endif
