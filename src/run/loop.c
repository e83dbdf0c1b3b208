/* The training loop (run.h run_train): each step's micro-batches and accumulation, the
 * step's one reduction and its decisions (non-finite steps, stop signals, a changed token
 * file), clipping, AdamW and the schedule, validation, the step line, checkpoints; at the
 * end the profile, the trace and the closing sample. */
#include "src/run/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safe_file.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/signals.h"
#include "src/engine/optim.h"
#include "src/job/fit.h"
#include "src/run/batch.h"
#include "src/run/faults.h"
#include "src/run/sample.h"
#include "src/watch/metrics.h"

enum { PROF_MAX = 32 };

/* runtime.profile: per-op seconds summed over the steps after the first (the first warms
 * caches and cuBLASLt plans) */
typedef struct loop_profile {
    double op_s[PROF_MAX], opt_s, opt_t0, step_s;
    int steps;
} loop_profile;

/* What the loop carries from step to step. */
typedef struct loop {
    run *r;
    watch *w;
    const ckpt_state *st0;     /* where the run started: step, data position, tokens */
    nonfinite_hook hook;       /* SHLM_TEST_NONFINITE (src/run/faults.h) */
    data_mix mix;              /* the checkpoint's data stream: same order, next sample */
    batch_rows br;
    lr_schedule sch;
    adamw_hparams hp;
    int first, end;            /* the run trains steps first+1..end */
    int64_t adamw_step;        /* updates applied */
    int64_t in_a_row;          /* non-finite steps skipped since the last update */
    long long tokens_per_step;
    size_t device_peak;        /* device memory in use, sampled after each step */
    uint64_t wire[2];          /* bytes sent in the shard, replica group by the steps */
    ckpt_async *async;         /* checkpoint.async: saves in the background; NULL: saved
                                * synchronously */
    loop_profile prof;
    /* a mixture's sources in the metrics: their file names (the paths where two share a
     * name) and tokens taken */
    const char *source_names[DATA_MIX_MAX];
    long long source_tokens[DATA_MIX_MAX];
} loop;

/* One step's outcome. */
typedef struct step_result {
    /* loss sum, trained targets, ranks whose loss or norm is not finite, ranks whose token
     * file changed: summed over the world in the step's one reduction */
    double sums[4];
    double norm;
    float lr;
    int data_failed;           /* this rank's token file changed */
    int nonfinite;             /* the step is not applied */
    int nonfinite_stop;        /* ... and the run ends on it */
    char err[1536];            /* this rank's data error */
} step_result;

static int loop_open(loop *L, run *r, const ckpt_state *st0, watch *w) {
    const job_config *c = &r->cfg;
    memset(L, 0, sizeof *L);
    L->r = r;
    L->w = w;
    L->st0 = st0;
    char err[1536] = "";
    if (any_rank_failed(nonfinite_hook_get(r->rank, &L->hook, err, sizeof err) == 0, err))
        return -1;
    /* a mixture continues from each source's position in the checkpoint (resume_rules
     * checked the files and weights against the job's) */
    data_mix_saved *saved = calloc(DATA_MIX_MAX, sizeof *saved);
    SHLM_CHECK_ALLOC(saved);
    int n_saved = 0;
    if (data_mix_state_parse(st0->data_sources, saved, &n_saved, err, sizeof err) != 0)
        SHLM_FATAL("data.train_sources: %s", err);
    const token_file *tfs[DATA_MIX_MAX];
    double weights[DATA_MIX_MAX];
    for (int i = 0; i < r->train_list.n; i++)
        tfs[i] = &r->train_tf[i], weights[i] = r->train_list.e[i].weight;
    if (data_mix_init(&L->mix, tfs, weights, r->train_list.n, c->seq_len, st0->shuffle,
                      st0->seed, r->rank, r->world, c->micro_batch, c->doc_mask,
                      n_saved ? saved : NULL, err, sizeof err) != 0)
        SHLM_FATAL("%s", err);
    free(saved);
    for (int i = 0; i < r->train_list.n; i++) {
        const char *path = r->train_list.e[i].path, *slash = strrchr(path, '/');
        L->source_names[i] = slash ? slash + 1 : path;
    }
    for (int i = 0; i < r->train_list.n; i++)
        for (int k = 0; k < i; k++)
            if (strcmp(L->source_names[i], L->source_names[k]) == 0)
                for (int j = 0; j < r->train_list.n; j++)
                    L->source_names[j] = r->train_list.e[j].path;
    L->first = (int)st0->step;
    L->end = c->stop_after > 0 ? c->stop_after : c->steps;
    batch_rows_alloc(&L->br, c);
    L->sch = lr_schedule_job(c->lr, c->min_lr, c->warmup_steps, c->steps);
    if (st0->lr_decay_from >= 0) { /* extended when a resume changed train.steps */
        L->sch.decay_from = (int)st0->lr_decay_from;
        L->sch.decay_lr = (float)st0->lr_decay_lr;
    }
    L->hp = (adamw_hparams){c->beta1, c->beta2, c->eps, c->weight_decay};
    L->adamw_step = st0->adamw_step;
    L->in_a_row = st0->skipped_in_a_row;
    L->tokens_per_step = (long long)c->global_batch * c->seq_len;
    watch_set_range(w, L->first, L->end);
    model_set_profile(r->model, c->profile);
    if (checkpoint_async_used(c, L->first, L->end)) {
        /* the staging is allocated after the engine: MemAvailable counts what it took */
        double avail = -1;
        char what[256] = "host memory unknown";
        if (fit_host_memory(r->local_size, &avail, what, sizeof what) != 0) avail = -1;
        (void)checkpoint_async_open(&L->async, r->ops, r->engine, &r->topo, c, &r->hf, avail,
                                    what);
    }
    if (r->rank == 0) {
        printf("model: %lld parameters, %.3g FLOP/token; %d micro-batch(es) of %d x %d per rank "
               "per step; run dir %s\n",
               (long long)model_shape_param_count(&c->model),
               model_shape_flops_per_token(&c->model, c->seq_len), r->grad_accum,
               c->micro_batch, c->seq_len, c->run_dir);
        metrics_print_header(stdout);
    }
    if (r->rank == 0 && L->first >= L->end)
        printf("checkpoint: step %d reached already (train.%s = %d): nothing to train\n",
               L->first, c->stop_after > 0 ? "stop_after" : "steps", L->end);
    return 0;
}

/* Forward and backward of the step's micro-batches, the gradients finished, and the
 * step's one reduction. The step's loss is the token-weighted mean over all its
 * micro-batches and ranks: the loss sum over N trained targets, divided by N. Every rank
 * counts N itself from the file (the step's G samples), so the scale is known before the
 * first backward without a collective; each trained target's loss gradient is then W / N,
 * which the reductions' average over the W ranks turns into 1 / N. */
static void step_gradients(loop *L, int s, step_result *o) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    int32_t *in = L->br.inputs, *tg = L->br.targets, *ds = L->br.doc_start;
    fsdp_zero_grad(r->engine);
    fsdp_begin_pass(r->engine, 1);
    const uint64_t step_start =
        L->st0->data_position + (uint64_t)(s - L->first) * c->global_batch;
    int64_t n_step = 0;
    if (data_mix_step(&L->mix, step_start, c->global_batch, &n_step, o->err, sizeof o->err) != 0) {
        o->data_failed = 1; /* zeroed rows (what a failed batch leaves) keep this rank in the
                             * step's collectives; the step-end check ends the run */
        memset(in, 0, L->br.n * sizeof *in);
        memset(tg, 0, L->br.n * sizeof *tg);
        if (ds) memset(ds, 0, L->br.n * sizeof *ds);
    } else if (n_step == 0 && r->rank == 0) {
        fprintf(stderr, "shardlm: warning: step %d: no target of its %d sequences is trained "
                "(all masked): its gradient is zero\n", s + 1, c->global_batch);
    }
    const float scale = n_step > 0 ? (float)r->world / (float)n_step : 0.0f;
    for (int m = 0; m < r->grad_accum; m++) {
        if (!o->data_failed &&
            data_mix_batch(&L->mix, m, in, tg, ds, o->err, sizeof o->err) != 0)
            o->data_failed = 1;
        int valid = 0;
        if (m == r->grad_accum - 1) fsdp_last_micro_batch(r->engine);
        batch_rows_keys(&L->br, &L->mix, L->st0->seed, m);
        const model_batch mb = {in, tg, ds, c->micro_batch, c->seq_len, L->br.row_keys};
        o->sums[0] += model_forward_backward(r->model, &mb, scale, &valid);
        o->sums[1] += valid;
    }
    if (nonfinite_hook_hits(&L->hook, NF_LOSS, s + 1)) o->sums[0] = NAN;
    if (c->profile) r->ops->sync(), L->prof.opt_t0 = MPI_Wtime();
    o->norm = fsdp_finish_grads(r->engine);
    if (nonfinite_hook_hits(&L->hook, NF_NORM, s + 1)) o->norm = NAN;
    /* whether this rank's loss or gradient norm is not finite, in the one reduction before
     * the update: every rank, replicas included, then takes the same decision (the norm is
     * the shard group's, its NaN spread by the reductions) */
    o->sums[2] = isfinite(o->sums[0]) && isfinite(o->norm) ? 0 : 1;
    o->sums[3] = o->data_failed;
    MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, o->sums, 4, MPI_DOUBLE, MPI_SUM,
                                   MPI_COMM_WORLD));
    /* the ranks' batches hold exactly the targets counted for the scale */
    if (o->sums[3] == 0 && o->sums[1] != (double)n_step)
        SHLM_FATAL("step %d: the batches hold %.0f trained targets, %lld were counted", s + 1,
                   o->sums[1], (long long)n_step);
}

/* AdamW with the step's rate and clip factor, unless the step is not finite: then its
 * update is dropped (weights, moments and AdamW's step count stay) and, under
 * train.on_nonfinite = abort or past train.max_skipped such steps in a row, the run
 * ends. */
static void step_update(loop *L, int s, step_result *o) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    o->nonfinite = o->sums[2] > 0;
    o->lr = lr_at(&L->sch, s);
    if (!o->nonfinite) {
        fsdp_optimizer_step(r->engine, o->lr, clip_factor(o->norm, c->grad_clip), &L->hp,
                            (int)++L->adamw_step);
        L->in_a_row = 0;
        if (nonfinite_hook_hits(&L->hook, NF_WEIGHTS, s + 1))
            nonfinite_poison_embedding(r->engine);
    } else {
        L->in_a_row++;
    }
    o->nonfinite_stop = o->nonfinite && (c->on_nonfinite != NONFINITE_SKIP ||
                                         L->in_a_row > c->max_skipped);
}

/* The step's end: the profile's share, every collective finished, memory and exposed
 * comm measured, and the step-end reduction (src/watch/watch.h): a stop signal seen by any
 * rank stops all after this same step, and so does a token file that changed under the
 * run; the slowest rank's time is the step's. */
static void step_end(loop *L, int s, double t0, const shlm_comm_stats before[2],
                     const step_result *o, step_record *rec, size_t *mem_peak) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    if (c->profile) {
        r->ops->sync();
        double step_prof[PROF_MAX];
        model_take_profile(r->model, step_prof);
        if (s > L->first) {
            for (int k = 0; k < model_family_of(r->model)->n_prof; k++)
                L->prof.op_s[k] += step_prof[k];
            L->prof.opt_s += MPI_Wtime() - L->prof.opt_t0;
            L->prof.steps++;
        }
    }
    /* poll until every collective has finished: the comm watchdog turns a stuck or failed
     * one into an abort instead of a hang in sync() */
    while (r->comm->progress() > 0) usleep(20);
    r->ops->sync();
    size_t used = 0, total = 0;
    if (r->ops->mem_info && r->ops->mem_info(&used, &total) == 0 && used > L->device_peak)
        L->device_peak = used;
    *mem_peak = r->ops->mem_info ? L->device_peak : peak_rss_bytes();
    double comm_ms[2]; /* exposed comm of the shard, replica group in this step */
    shlm_comm_stats after[2];
    fsdp_comm_stats(r->engine, &after[0], &after[1]);
    for (int g = 0; g < 2; g++) {
        comm_ms[g] = 1e-6 * (double)(after[g].blocked_ns - before[g].blocked_ns);
        for (int op = 0; op < SHLM_COMM_N_OPS; op++)
            L->wire[g] += after[g].wire[op] - before[g].wire[op];
    }
    watch_step_end(L->w, (double)shlm_signals_pending(), (double)o->data_failed,
                   MPI_Wtime() - t0, comm_ms, *mem_peak, rec);
    if (c->profile && s > L->first) L->prof.step_s += rec->slow_ms / 1000;
}

/* Validation after step s where the job asks for it (every eval_every steps, and the
 * last), into *val; a stop signal seen during the pass becomes *stop_sig. -1 when a
 * rank's token file changed (message printed). */
static int step_validate(loop *L, int s, int last, double *val, int *stop_sig) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    *val = NAN;
    if (!r->have_val || !(last || (c->eval_every > 0 && (s + 1) % c->eval_every == 0)))
        return 0;
    const int v = run_validate(r, val, NULL);
    if (v < 0) return -1;
    if (v > 0 && r->rank == 0)
        printf("validation after step %d stopped by %s: no validation loss for it\n", s + 1,
               shlm_signal_name(v));
    if (v > 0) *stop_sig = v;
    return 0;
}

/* The line that ends a run on a step that is not finite: nothing of it reaches the
 * weights or a checkpoint. */
static void report_nonfinite(const loop *L, int s, const step_result *o, double loss) {
    const run *r = L->r;
    const job_config *c = &r->cfg;
    if (r->rank != 0) return;
    char what[160];
    snprintf(what, sizeof what, "step %d: the loss or the gradient norm is not finite on %d of "
             "%d ranks (mean loss %g, rank 0's gradient norm %g)", s + 1, (int)o->sums[2],
             r->world, loss, o->norm);
    if (c->on_nonfinite != NONFINITE_SKIP)
        fprintf(stderr, "shardlm: error: %s; stopping before the update, nothing more saved "
                "(train.on_nonfinite = abort; skip drops such steps)\n", what);
    else
        fprintf(stderr, "shardlm: error: %s, %lld steps in a row, more than train.max_skipped = "
                "%d; stopping, nothing more saved\n", what, (long long)L->in_a_row,
                c->max_skipped);
    fflush(stderr);
}

/* The checkpoint of step s + 1 (checkpoint.dir): every N steps, at the end and on a stop
 * signal (`final`: saved before the run exits, after the save in flight, if any); in the
 * background with checkpoint.async but for the final one. -1 when the save (or the one in
 * flight) failed (message printed): the run ends. */
static int step_save(loop *L, int s, float lr, int final) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    const ckpt_state *st0 = L->st0;
    ckpt_state st = *st0;
    st.step = s + 1;
    st.adamw_step = L->adamw_step;
    st.skipped_in_a_row = L->in_a_row;
    st.steps = c->steps;
    st.tokens_seen = st0->tokens_seen + L->tokens_per_step * (s + 1 - L->first);
    st.data_position = st0->data_position + (uint64_t)(s + 1 - L->first) * c->global_batch;
    st.global_batch = c->global_batch;
    st.seq_len = c->seq_len;
    st.lr_last = lr;
    snprintf(st.data_train, sizeof st.data_train, "%s", c->data_train);
    /* one file: its identity; a mixture: each source's, with its position */
    const int mix = L->mix.n > 1;
    st.data_bytes = mix ? 0 : r->train_tf[0].size;
    st.data_fingerprint = mix ? 0 : r->train_tf[0].fingerprint;
    if (data_mix_state_text(&L->mix, &r->train_list, st.data_sources, sizeof st.data_sources) != 0)
        SHLM_FATAL("the data mixture's state does not fit the checkpoint's attribute");
    st.lora_rank = c->lora.rank;
    st.lora_targets = (int)c->lora.targets;
    st.lora_dora = c->lora.dora;
    st.lora_alpha = c->lora.rank > 0 ? c->lora.alpha : 0;
    st.lora_rslora = c->lora.rank > 0 ? c->lora.rslora : 0;
    st.lora_dropout = c->lora.rank > 0 ? c->lora.dropout : 0;
    st.lora_base[0] = '\0';
    if (c->lora.rank > 0) run_base_name(c, st.lora_base, sizeof st.lora_base);
    st.lora_base_fingerprint = c->lora.rank > 0 ? r->base_fingerprint : 0;
    char err[1536] = "";
    int rc;
    if (L->async && !final) {
        rc = checkpoint_async_save(L->async, &st, err, sizeof err);
    } else {
        /* the last save of the run is written before it exits: the one in flight first */
        if (checkpoint_async_in_flight(L->async) && r->rank == 0) {
            printf("checkpoint: step %d waits for the save in flight, then saves\n", s + 1);
            fflush(stdout);
        }
        rc = checkpoint_async_wait(L->async, err, sizeof err);
        if (rc == 0)
            rc = checkpoint_save(r->engine, &r->topo, c, &st, &r->hf, c->ckpt_dir,
                                 c->ckpt_keep, err, sizeof err);
    }
    if (rc == 0) return 0;
    any_rank_failed(0, err);
    return -1;
}

/* A stop signal ends the run after step s + 1: saved where checkpoint.dir is set, else
 * stopped cleanly all the same (not killed mid-step), but with a non-zero exit since the
 * work since the start is lost. Returns the run's status. */
static int report_stop(const loop *L, int s, int stop_sig) {
    const run *r = L->r;
    const job_config *c = &r->cfg;
    if (r->rank == 0 && c->ckpt_dir[0])
        printf("shardlm: caught %s at step %d: saved %s/step_%d.h5, exiting\n",
               shlm_signal_name(stop_sig), s + 1, c->ckpt_dir, s + 1);
    else if (r->rank == 0)
        fprintf(stderr, "shardlm: error: caught %s at step %d, but checkpoint.dir is not set: "
                "nothing saved, exiting\n", shlm_signal_name(stop_sig), s + 1);
    fflush(stdout);
    fflush(stderr);
    shlm_signals_stop_handled();
    return c->ckpt_dir[0] ? 0 : -1;
}

/* Rank 0's time per step by op category (runtime.profile), each op timed between two
 * synchronisations, so the sum is a serialised step, longer than a normal one. */
static void print_profile(const model_family *f, const loop_profile *p) {
    double sum = p->opt_s;
    const int steps = p->steps;
    for (int k = 0; k < f->n_prof; k++) sum += p->op_s[k];
    printf("# profile (rank 0, mean of %d step(s) after the first; ops timed between syncs)\n", steps);
    printf("# %-36s %10s %7s\n", "category", "ms/step", "share");
    for (int k = 0; k < f->n_prof; k++)
        printf("  %-36s %10.2f %6.1f%%\n", f->prof_names[k], 1e3 * p->op_s[k] / steps,
               100 * p->op_s[k] / sum);
    printf("  %-36s %10.2f %6.1f%%\n", "grad finish + optimizer", 1e3 * p->opt_s / steps,
           100 * p->opt_s / sum);
    printf("  %-36s %10.2f\n", "sum of the above", 1e3 * sum / steps);
    printf("  %-36s %10.2f  (the rest: host work outside ops)\n", "measured step (profiled)",
           1e3 * p->step_s / steps);
}

/* Each rank writes its schedule trace to <run_dir>/trace.rank<R>.jsonl (replaced whole,
 * io/safe_file.h). Returns 0, or -1 with err. */
static int write_trace(run *r, char *err, size_t errlen) {
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); /* rank 0 created run_dir */
    char path[1200];
    snprintf(path, sizeof path, "%s/trace.rank%d.jsonl", r->cfg.run_dir, r->rank);
    safe_file out;
    if (safe_file_begin(&out, path, err, errlen) != 0) return -1;
    fsdp_trace_write(r->engine, out.fp);
    return safe_file_finish(&out, err, errlen);
}

/* After the last step (or a stop): the profile, the bytes sent, the plan check, the
 * summary, the trace and the closing sample. */
static int loop_close(loop *L, int rc, int stopped_at) {
    run *r = L->r;
    const job_config *c = &r->cfg;
    const int done = stopped_at > 0 ? stopped_at : L->end;
    const uint64_t ran = done > L->first ? (uint64_t)(done - L->first) : 1;
    if (c->profile && r->rank == 0 && L->prof.steps > 0)
        print_profile(model_family_of(r->model), &L->prof);
    if (r->rank == 0 && rc == 0)
        printf("comm per step (rank 0, sent): shard_group_bytes=%llu replica_group_bytes=%llu\n",
               (unsigned long long)(L->wire[0] / ran), (unsigned long long)(L->wire[1] / ran));
    checkpoint_async_close(L->async);
    run_plan_check_end(r, L->device_peak);
    if (rc == 0 && run_check_base(r) != 0) rc = -1;
    batch_rows_free(&L->br);
    if (r->rank == 0) data_mix_print_summary(&L->mix, &r->train_list, stdout);
    data_mix_free(&L->mix);
    watch_summary(L->w, rc == 0);
    if (rc != 0) return rc;
    char err[1536] = "";
    if (c->trace && any_rank_failed(write_trace(r, err, sizeof err) == 0, err)) return -1;
    if (c->sample_tokens > 0 && stopped_at == 0) run_print_sample(r);
    return 0;
}

int run_train(run *r, const ckpt_state *st0, watch *w) {
    const job_config *c = &r->cfg;
    loop L;
    if (loop_open(&L, r, st0, w) != 0) return -1;
    int rc = 0, stopped_at = 0; /* the step after which a stop signal ended the loop */
    for (int s = L.first; s < L.end; s++) {
        shlm_watchdog_test_stop(r->rank, s + 1);
        shlm_comm_stats before[2];
        fsdp_comm_stats(r->engine, &before[0], &before[1]);
        const double t0 = MPI_Wtime();
        step_result o = {.data_failed = 0};
        step_gradients(&L, s, &o);
        step_update(&L, s, &o);
        step_record rec;
        size_t mem_peak;
        step_end(&L, s, t0, before, &o, &rec, &mem_peak);
        if (rec.data_failed > 0) { /* a rank trained on zeroed rows: log and save nothing */
            any_rank_failed(!o.data_failed, o.err);
            rc = -1;
            break;
        }
        const int last = s == L.end - 1;
        /* stopping early on a signal: log this step, skip validation (or end it at the
         * batch where the signal is seen), save, exit */
        int stop_sig = last ? 0 : (int)rec.stop_signal;
        double val = NAN;
        if (!stop_sig && !o.nonfinite_stop && step_validate(&L, s, last, &val, &stop_sig) != 0) {
            rc = -1;
            break;
        }
        const double loss = o.sums[1] > 0 ? o.sums[0] / o.sums[1] : NAN;
        step_metrics sm = {.step = s + 1, .loss = loss, .val_loss = val, .lr = o.lr,
                           .grad_norm = o.norm, .mem_peak_bytes = mem_peak,
                           .tokens_seen = st0->tokens_seen +
                                          L.tokens_per_step * (s + 1 - L.first),
                           .skipped = o.nonfinite};
        if (L.mix.n > 1) {
            for (int i = 0; i < L.mix.n; i++) L.source_tokens[i] = data_mix_tokens(&L.mix, i);
            sm.n_sources = L.mix.n;
            sm.source_names = L.source_names;
            sm.source_tokens = L.source_tokens;
        }
        watch_step(w, &sm, &rec, last || stop_sig || o.nonfinite ||
                                     (s + 1) % c->log_every == 0 || !isnan(val));
        /* a background save that failed ends the run at the first step boundary after it,
         * on every rank, as a failed synchronous save does */
        char err[1536] = "";
        if (checkpoint_async_poll(L.async, err, sizeof err) != 0) {
            any_rank_failed(0, err);
            rc = -1;
            break;
        }
        if (o.nonfinite_stop) {
            /* a save still in flight is of an earlier step: where it failed, its line is
             * the run's one line, as a run that saves synchronously stopped there */
            if (checkpoint_async_wait(L.async, err, sizeof err) != 0)
                any_rank_failed(0, err);
            else
                report_nonfinite(&L, s, &o, loss);
            rc = -1;
            break;
        }
        if (c->ckpt_dir[0] &&
            (last || stop_sig || (c->ckpt_every > 0 && (s + 1) % c->ckpt_every == 0)) &&
            step_save(&L, s, o.lr, last || stop_sig) != 0) {
            rc = -1;
            break;
        }
        if (stop_sig) {
            rc = report_stop(&L, s, stop_sig);
            stopped_at = s + 1;
            break;
        }
    }
    return loop_close(&L, rc, stopped_at);
}
