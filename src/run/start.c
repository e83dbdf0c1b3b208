/* Where a run's weights and state come from (run.h run_load_initial, run_load_weights):
 * a resumed checkpoint under the resume rules, model.init_from, or the seed. */
#include "src/run/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/base/startup.h"
#include "src/engine/optim.h"
#include "src/job/lora_keys.h"

/* What a resumed job may change (config.c's checkpoint.allow_*_change say what each
 * means): a training file other than the checkpoint's (by size and fingerprint; older
 * checkpoints keep none), or a train.seq_len, global_batch or steps other than its, is
 * refused unless allowed, naming both files or values and the key; an allowed change
 * adjusts *st (the data position in windows of the new length; the schedule's new
 * cosine). tf: the training file. Local: every rank reaches the same verdict. */
/* The mixture's part of the resume rules: a checkpoint of a mixture resumes a job of a
 * mixture (and one file one file); the same files (by size and fingerprint) with the same
 * weights continue as they were; other files or weights only under
 * checkpoint.allow_mix_change, which rewrites st->data_sources: each job file the
 * checkpoint knows keeps its position, a new one starts at 0, and the weights' schedule
 * restarts (every source's count since the weights took effect is 0). */
static int mix_rules(const run *r, const char *path, data_mix_saved *saved,
                     data_mix_saved *next, ckpt_state *st, char *err, size_t errlen);
static int resume_mix_rules(const run *r, const char *path, ckpt_state *st, char *err,
                            size_t errlen) {
    const job_config *c = &r->cfg;
    const data_mix_list *l = &r->train_list;
    const int saved_mix = st->data_sources[0] != '\0', job_mix = l->n > 1;
    if (!saved_mix && !job_mix) return 0;
    if (saved_mix != job_mix) {
        snprintf(err, errlen, "%.200s was saved training on %s %.300s; this job's data.train is "
                 "%s %.300s: the data positions of one file and of a mixture do not translate; "
                 "resume with data.train = %.300s", path, saved_mix ? "the mixture" : "the file",
                 st->data_train, job_mix ? "the mixture" : "the file", c->data_train,
                 st->data_train);
        return -1;
    }
    data_mix_saved *saved = calloc(2 * DATA_MIX_MAX, sizeof *saved), *next = saved + DATA_MIX_MAX;
    SHLM_CHECK_ALLOC(saved);
    const int rc = mix_rules(r, path, saved, next, st, err, errlen);
    free(saved);
    return rc;
}

/* resume_mix_rules for two mixtures, with room for the checkpoint's sources (saved) and
 * the job's (next) */
static int mix_rules(const run *r, const char *path, data_mix_saved *saved,
                     data_mix_saved *next, ckpt_state *st, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    const data_mix_list *l = &r->train_list;
    int n = 0;
    char why[400];
    if (data_mix_state_parse(st->data_sources, saved, &n, why, sizeof why) != 0) {
        snprintf(err, errlen, "%.200s: attribute data.train_sources: %s (a corrupt or edited "
                 "checkpoint)", path, why);
        return -1;
    }
    char diff[1400] = "";
    if (n != l->n)
        snprintf(diff, sizeof diff, "%d files there, %d here", n, l->n);
    for (int i = 0; i < l->n && !diff[0]; i++) {
        const token_file *tf = &r->train_tf[i];
        if (saved[i].bytes != tf->size || saved[i].fingerprint != tf->fingerprint)
            snprintf(diff, sizeof diff, "file %d is %.300s (%llu bytes, fingerprint %016llx) "
                     "there, %.300s (%llu bytes, fingerprint %016llx) here", i + 1, saved[i].path,
                     (unsigned long long)saved[i].bytes, (unsigned long long)saved[i].fingerprint,
                     l->e[i].path, (unsigned long long)tf->size,
                     (unsigned long long)tf->fingerprint);
        else if (saved[i].weight != l->e[i].weight)
            snprintf(diff, sizeof diff, "%.300s's weight is %.4g there, %.4g here (normalised)",
                     l->e[i].path, saved[i].weight, l->e[i].weight);
    }
    if (!diff[0]) return 0;
    if (!c->allow_mix_change) {
        snprintf(err, errlen, "%.200s was saved training on the mixture %.300s; this job's "
                 "data.train differs: %s; set checkpoint.allow_mix_change = true to keep each "
                 "file's position and apply this job's weights from the next step, or resume "
                 "with data.train = %.300s", path, st->data_train, diff, st->data_train);
        return -1;
    }
    for (int i = 0; i < l->n; i++) {
        const token_file *tf = &r->train_tf[i];
        next[i] = (data_mix_saved){0, 0, tf->size, tf->fingerprint, l->e[i].weight, ""};
        snprintf(next[i].path, sizeof next[i].path, "%s", l->e[i].path);
        for (int k = 0; k < n; k++)
            if (saved[k].bytes == tf->size && saved[k].fingerprint == tf->fingerprint)
                next[i].drawn = saved[k].drawn;
    }
    if (data_mix_saved_text(next, l->n, st->data_sources, sizeof st->data_sources) != 0) {
        snprintf(err, errlen, "%.200s: the mixture's state does not fit the checkpoint", path);
        return -1;
    }
    snprintf(st->data_train, sizeof st->data_train, "%s", c->data_train);
    return 0;
}

static int resume_rules(const run *r, const char *path, ckpt_state *st, char *err,
                        size_t errlen) {
    const job_config *c = &r->cfg;
    const token_file *tf = &r->train_tf[0];
    const uint64_t n_tokens = tf->count;
    const int mix = r->train_list.n > 1;
    if (resume_mix_rules(r, path, st, err, errlen) != 0) return -1;
    if (!mix && st->data_bytes && !c->allow_data_change &&
        (st->data_bytes != tf->size || st->data_fingerprint != tf->fingerprint)) {
        snprintf(err, errlen, "%.200s was saved training on %.200s (%llu bytes, fingerprint "
                 "%016llx); this job's data.train %.200s is another file (%llu bytes, fingerprint "
                 "%016llx): the checkpoint's data position counts samples of its own; set "
                 "checkpoint.allow_data_change = true to continue at the same sample index in "
                 "this file, or resume with data.train = %.200s", path, st->data_train,
                 (unsigned long long)st->data_bytes, (unsigned long long)st->data_fingerprint,
                 c->data_train, (unsigned long long)tf->size,
                 (unsigned long long)tf->fingerprint, st->data_train);
        return -1;
    }
    if (st->seq_len != c->seq_len) {
        if (!c->allow_seq_len_change) {
            snprintf(err, errlen, "%s was saved with train.seq_len = %d, this job has %d: its "
                     "data position counts windows of %d tokens; set "
                     "checkpoint.allow_seq_len_change = true to continue at the same token, or "
                     "resume with train.seq_len = %d", path, st->seq_len, c->seq_len, st->seq_len,
                     st->seq_len);
            return -1;
        }
        if (mix) {
            snprintf(err, errlen, "%s: checkpoint.allow_seq_len_change cannot apply to a "
                     "data.train mixture: each file's position counts windows of %d tokens; "
                     "resume with train.seq_len = %d", path, st->seq_len, st->seq_len);
            return -1;
        }
        if (st->shuffle) {
            snprintf(err, errlen, "%s: checkpoint.allow_seq_len_change cannot apply: its data is "
                     "shuffled (data.shuffle = true), and windows of %d tokens are permuted "
                     "otherwise than windows of %d, so its place in the epoch has no "
                     "equivalent; resume with train.seq_len = %d", path, st->seq_len,
                     c->seq_len, st->seq_len);
            return -1;
        }
        uint64_t pos;
        if (data_loader_reposition(st->data_position, n_tokens, st->seq_len, c->seq_len,
                                   &pos) != 0) {
            snprintf(err, errlen, "%s: data position %llu in windows of %d tokens has no "
                     "equivalent in windows of %d of this data", path,
                     (unsigned long long)st->data_position, st->seq_len, c->seq_len);
            return -1;
        }
        st->data_position = pos;
        st->seq_len = c->seq_len;
    }
    if (st->global_batch != c->global_batch) {
        if (!c->allow_global_batch_change) {
            snprintf(err, errlen, "%s was saved with train.global_batch = %d, this job has %d: "
                     "set checkpoint.allow_global_batch_change = true to take %d sequences per "
                     "step from the next sample on, or resume with train.global_batch = %d",
                     path, st->global_batch, c->global_batch, c->global_batch,
                     st->global_batch);
            return -1;
        }
        st->global_batch = c->global_batch;
    }
    if (st->steps != c->steps) {
        if (!c->allow_steps_change) {
            snprintf(err, errlen, "%s was saved with train.steps = %d, this job has %d: the "
                     "learning-rate schedule would be another one (lr %.3e at step %lld); set "
                     "checkpoint.allow_steps_change = true to continue from lr %.3e and decay to "
                     "train.min_lr at step %d, or resume with train.steps = %d", path, st->steps,
                     c->steps, st->lr_last, (long long)st->step, st->lr_last, c->steps,
                     st->steps);
            return -1;
        }
        lr_schedule ext = lr_schedule_extend(c->lr, c->min_lr, c->warmup_steps, c->steps,
                                             (int)st->step, (float)st->lr_last);
        st->lr_decay_from = ext.decay_from;
        st->lr_decay_lr = ext.decay_lr;
        st->steps = c->steps;
    }
    return 0;
}

/* LoRA: the frozen base from model.init_from (a Hugging Face directory: config.c refuses a
 * checkpoint there) or the seed; then, unless a checkpoint brings them (adapters_follow),
 * the adapters from lora.init_from (a PEFT adapter) or the seed, DoRA's magnitudes then
 * the base's row norms (PEFT's start: the adapted model is the base). The base's
 * fingerprint, taken here, is checked at the end of training (run_check_base). Returns 0,
 * or -1 with err (every rank). */
static int lora_start(run *r, int adapters_follow, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    startup_set_weights(c->init_from[0] ? STARTUP_WEIGHTS_IMPORT : STARTUP_WEIGHTS_SEED);
    if (c->init_from[0]) {
        if (checkpoint_import_hf(r->engine, &r->topo, &c->model, c->init_from, err, errlen) != 0)
            return -1;
    } else {
        fsdp_init_weights(r->engine, c->seed);
    }
    if (!adapters_follow && c->lora_init_from[0]) {
        if (checkpoint_import_peft(r->engine, &r->topo, c->lora_init_from, err, errlen) != 0)
            return -1;
    } else if (!adapters_follow) {
        fsdp_init_adapters(r->engine, c->seed);
        fsdp_lora_magnitudes(r->engine);
    }
    r->base_fingerprint = fsdp_base_fingerprint(r->engine);
    char name[1100];
    run_base_name(c, name, sizeof name);
    if (r->rank == 0)
        printf("lora: the frozen base (%s) has fingerprint %016llx\n", name,
               (unsigned long long)r->base_fingerprint);
    return 0;
}

void run_base_name(const job_config *c, char *out, size_t outlen) {
    const char *as = !c->lora.base_nf4     ? ""
                     : c->lora.double_quant ? ", stored as NF4 with double quant"
                                            : ", stored as NF4";
    if (c->init_from[0]) snprintf(out, outlen, "%s%s", c->init_from, as);
    else snprintf(out, outlen, "initialised from train.seed = %llu%s", (unsigned long long)c->seed, as);
}

/* Whether checkpoint path (its state st) holds what this job trains: the same adapters
 * (lora.rank, targets, dora, and from format 6 alpha and rslora), or none for a full
 * fine-tune, and for LoRA the same frozen base (by fingerprint, lora_start's, taken
 * before). 0, or -1 with err naming both. */
static int lora_matches(const run *r, const char *path, const ckpt_state *st, char *err,
                        size_t errlen) {
    const lora_config *lc = &r->cfg.lora;
    if (st->lora_rank != lc->rank || (lc->rank > 0 && ((unsigned)st->lora_targets != lc->targets ||
                                                       st->lora_dora != lc->dora))) {
        char mine[128], theirs[128];
        lora_targets_text(lc->targets, mine, sizeof mine);
        lora_targets_text((unsigned)st->lora_targets, theirs, sizeof theirs);
        snprintf(err, errlen, "%.400s holds %s lora.rank = %d, targets = %s, dora = %d; this job has "
                 "lora.rank = %d, targets = %s, dora = %d: resume with the checkpoint's [lora] "
                 "keys", path, st->lora_rank ? "adapters of" : "a full fine-tune,",
                 st->lora_rank, st->lora_rank ? theirs : "-", st->lora_dora, lc->rank,
                 lc->rank ? mine : "-", lc->dora);
        return -1;
    }
    /* the scale alpha / r (alpha / √r with rslora) the adapters were trained at; format 6
     * on (older files do not say, and keep the job's) */
    if (lc->rank > 0 && st->format_version >= 6 &&
        (st->lora_alpha != lc->alpha || st->lora_rslora != lc->rslora)) {
        snprintf(err, errlen, "%.400s holds adapters trained with lora.alpha = %g, rslora = %s; this "
                 "job has lora.alpha = %g, rslora = %s, which scales them otherwise: set the "
                 "checkpoint's", path, (double)st->lora_alpha, st->lora_rslora ? "true" : "false",
                 (double)lc->alpha, lc->rslora ? "true" : "false");
        return -1;
    }
    if (lc->rank > 0 && st->lora_base_fingerprint != r->base_fingerprint) {
        char mine[1100];
        run_base_name(&r->cfg, mine, sizeof mine);
        snprintf(err, errlen, "%.400s was trained on the frozen base (%.400s, fingerprint %016llx);"
                 " this job's base (%.400s) is another (fingerprint %016llx): resume on the "
                 "checkpoint's base", path, st->lora_base,
                 (unsigned long long)st->lora_base_fingerprint, mine,
                 (unsigned long long)r->base_fingerprint);
        return -1;
    }
    return 0;
}

int run_check_base(run *r) {
    if (!fsdp_lora(r->engine)) return 0;
    const uint64_t now = fsdp_base_fingerprint(r->engine);
    if (r->rank == 0)
        printf("lora: the frozen base's fingerprint after training %016llx (%s)\n",
               (unsigned long long)now, now == r->base_fingerprint ? "unchanged" : "CHANGED");
    if (now == r->base_fingerprint) return 0;
    char err[200];
    snprintf(err, sizeof err, "the frozen base changed during training (fingerprint %016llx, "
             "%016llx at the start)", (unsigned long long)now,
             (unsigned long long)r->base_fingerprint);
    return any_rank_failed(0, err);
}

/* The state a training run starts from: checkpoint.resume (weights, moments, step, data
 * position), else model.init_from (weights), else the seed's init and step 0. A resumed
 * job is checked against the checkpoint's state before any tensor is read
 * (resume_rules). Returns 0, or -1 with the message printed. */
static int load_initial_weights(run *r, ckpt_state *st);
int run_load_initial(run *r, ckpt_state *st) {
    int rc = load_initial_weights(r, st);
    startup_mark(STARTUP_WEIGHTS);
    startup_set_drawn(r->cfg.model.family->init_count());
    return rc;
}
static int load_initial_weights(run *r, ckpt_state *st) {
    const job_config *c = &r->cfg;
    char err[1536] = "", path[2048];
    *st = (ckpt_state){.seed = c->seed, .shuffle = c->shuffle, .global_batch = c->global_batch,
                       .seq_len = c->seq_len, .steps = c->steps, .lr_decay_from = -1};
    if (checkpoint_resolve(c->ckpt_dir, c->ckpt_resume, path, sizeof path, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    if (path[0]) {
        startup_set_weights(STARTUP_WEIGHTS_RESUME);
        if (r->rank == 0 && c->init_from[0])
            printf("checkpoint: resuming from %s; model.init_from = %s is not used\n", path,
                   c->init_from);
        ckpt_state peek;
        if (checkpoint_read_state(path, r->topo.world, &peek, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        int ok = resume_rules(r, path, &peek, err, sizeof err) == 0;
        if (any_rank_failed(ok, err)) return -1;
        if (fsdp_lora(r->engine) && lora_start(r, 1, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        if (any_rank_failed(lora_matches(r, path, &peek, err, sizeof err) == 0, err)) return -1;
        if (checkpoint_load(r->engine, &r->topo, &c->model, path, CKPT_LOAD_ALL, st, err,
                            sizeof err) != 0 ||
            checkpoint_read_hf_path(path, r->topo.world, &r->hf, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        const ckpt_state saved = *st;
        if (resume_rules(r, path, st, err, sizeof err) != 0)
            return any_rank_failed(0, err); /* the file changed since it was first read */
        if (r->rank == 0 && strcmp(saved.data_sources, st->data_sources) != 0)
            printf("checkpoint: data.train's mixture changed (checkpoint.allow_mix_change): "
                   "each file the checkpoint knows continues from its position there, the "
                   "weights apply from the next step\n");
        if (r->rank == 0 && st->data_bytes && r->train_list.n == 1 &&
            (st->data_bytes != r->train_tf[0].size ||
             st->data_fingerprint != r->train_tf[0].fingerprint))
            printf("checkpoint: data.train is not the checkpoint's file %s "
                   "(checkpoint.allow_data_change): the next step takes sample %llu of %s\n",
                   st->data_train, (unsigned long long)st->data_position, c->data_train);
        if (r->rank == 0 && (st->seed != c->seed || st->shuffle != c->shuffle))
            printf("checkpoint: the data order continues from the checkpoint's train.seed = %llu, "
                   "data.shuffle = %d (the job says %llu, %d)\n", (unsigned long long)st->seed,
                   st->shuffle, (unsigned long long)c->seed, c->shuffle);
        if (r->rank == 0 && saved.seq_len != st->seq_len)
            printf("checkpoint: train.seq_len %d -> %d (checkpoint.allow_seq_len_change): data "
                   "position %llu -> %llu, the first window of %d tokens at or after the first "
                   "unread token\n", saved.seq_len, st->seq_len,
                   (unsigned long long)saved.data_position, (unsigned long long)st->data_position,
                   st->seq_len);
        if (r->rank == 0 && saved.global_batch != st->global_batch)
            printf("checkpoint: train.global_batch %d -> %d (checkpoint.allow_global_batch_change)"
                   ": the next step starts at sample %llu\n", saved.global_batch,
                   c->global_batch, (unsigned long long)st->data_position);
        if (r->rank == 0 && saved.steps != st->steps && st->step <= c->warmup_steps)
            printf("checkpoint: train.steps %d -> %d (checkpoint.allow_steps_change): the "
                   "warm-up continues, then the cosine decays to %.3e at step %d\n",
                   saved.steps, st->steps, c->min_lr, st->steps);
        else if (r->rank == 0 && saved.steps != st->steps)
            printf("checkpoint: train.steps %d -> %d (checkpoint.allow_steps_change): the "
                   "learning rate continues from %.3e and decays to %.3e at step %d\n",
                   saved.steps, st->steps, st->lr_last, c->min_lr, st->steps);
        return 0;
    }
    if (fsdp_lora(r->engine))
        return lora_start(r, 0, err, sizeof err) == 0 ? 0 : any_rank_failed(0, err);
    if (!c->init_from[0]) { /* run_setup deferred this: loads overwrite every shard */
        startup_set_weights(STARTUP_WEIGHTS_SEED);
        fsdp_init_weights(r->engine, c->seed);
        return 0;
    }
    startup_set_weights(STARTUP_WEIGHTS_IMPORT);
    if (checkpoint_init_from(r->engine, &r->topo, &c->model, c->init_from, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    /* a checkpoint's weights bring the files it kept, where the job's sources lack them */
    if (!c->hf_model &&
        (checkpoint_resolve("", c->init_from, path, sizeof path, err, sizeof err) != 0 ||
         checkpoint_read_hf_path(path, r->topo.world, &r->hf, err, sizeof err) != 0))
        return any_rank_failed(0, err);
    return 0;
}

static int load_forward_weights(run *r, const char *ckpt, char *what, size_t whatlen);
int run_load_weights(run *r, const char *ckpt, char *what, size_t whatlen) {
    int rc = load_forward_weights(r, ckpt, what, whatlen);
    startup_mark(STARTUP_WEIGHTS);
    startup_set_drawn(r->cfg.model.family->init_count());
    return rc;
}
static int load_forward_weights(run *r, const char *ckpt, char *what, size_t whatlen) {
    const job_config *c = &r->cfg;
    char err[1536] = "", path[2048] = "";
    if (!ckpt) {
        if (checkpoint_resolve(c->ckpt_dir, c->ckpt_resume, path, sizeof path, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        if (path[0]) ckpt = path;
        else if (c->init_from[0] && !fsdp_lora(r->engine)) ckpt = c->init_from;
    }
    if (fsdp_lora(r->engine)) { /* the base, then the checkpoint's adapters */
        if (lora_start(r, ckpt != NULL, err, sizeof err) != 0) return any_rank_failed(0, err);
        snprintf(what, whatlen, "%s%s%s", c->init_from[0] ? c->init_from : "the seed's base",
                 ckpt || c->lora_init_from[0] ? " with the adapters of " : "",
                 ckpt ? ckpt : c->lora_init_from);
        if (!ckpt) return 0;
        startup_set_weights(ckpt == path ? STARTUP_WEIGHTS_RESUME : STARTUP_WEIGHTS_IMPORT);
        char file[2048];
        ckpt_state st;
        if (checkpoint_resolve("", ckpt, file, sizeof file, err, sizeof err) != 0 ||
            checkpoint_read_state(file, r->topo.world, &st, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        if (any_rank_failed(lora_matches(r, file, &st, err, sizeof err) == 0, err)) return -1;
        if (checkpoint_load(r->engine, &r->topo, &c->model, file, CKPT_LOAD_WEIGHTS, NULL, err,
                            sizeof err) != 0)
            return any_rank_failed(0, err);
        return 0;
    }
    if (!ckpt) {
        snprintf(what, whatlen, "freshly initialised weights (train.seed = %llu)",
                 (unsigned long long)c->seed);
        if (r->rank == 0)
            printf("note: %s: no --ckpt, checkpoint (checkpoint.resume, checkpoint.dir) or "
                   "model.init_from: the model has %s\n", c->path, what);
        startup_set_weights(STARTUP_WEIGHTS_SEED); /* run_setup deferred it */
        fsdp_init_weights(r->engine, c->seed);
        return 0;
    }
    startup_set_weights(ckpt == path ? STARTUP_WEIGHTS_RESUME : STARTUP_WEIGHTS_IMPORT);
    snprintf(what, whatlen, "%s", ckpt);
    if (checkpoint_init_from(r->engine, &r->topo, &c->model, ckpt, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    return 0;
}
