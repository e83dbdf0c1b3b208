/* Optimizer hyper-parameters, the learning-rate schedule (linear warm-up, cosine
 * decay) and the gradient-clipping factor. The AdamW arithmetic is in the ops table. */
#ifndef SHLM_OPTIM_H
#define SHLM_OPTIM_H

typedef struct adamw_hparams {
    float beta1, beta2, eps, weight_decay;
} adamw_hparams;

/* Warm-up to lr over warmup_steps, then a cosine from decay_lr at 0-based step
 * decay_from down to min_lr at the last step (total_steps - 1). The job's own schedule
 * has decay_from = warmup_steps and decay_lr = lr (lr_schedule_job); a schedule extended
 * when a resume changes train.steps starts its cosine at the checkpoint's last step and
 * learning rate instead (lr_schedule_extend). */
typedef struct lr_schedule {
    float lr, min_lr;
    int warmup_steps, total_steps;
    int decay_from;
    float decay_lr;
} lr_schedule;

lr_schedule lr_schedule_job(float lr, float min_lr, int warmup_steps, int total_steps);

/* The schedule a run resumed at 0-based step `first` follows when train.steps changed
 * to total_steps: the job's own while `first` is still inside the warm-up (which does not
 * depend on train.steps), else a cosine from last_lr, the learning rate of step
 * first - 1, to min_lr at the new last step, so the rate continues without a jump. */
lr_schedule lr_schedule_extend(float lr, float min_lr, int warmup_steps, int total_steps,
                               int first, float last_lr);

/* Learning rate of 0-based step s. */
float lr_at(const lr_schedule *sch, int s);

/* Factor to multiply gradients by so their global L2 norm is at most max_norm
 * (1 when max_norm <= 0 or the norm is already below it). */
float clip_factor(double grad_norm, float max_norm);

#endif
