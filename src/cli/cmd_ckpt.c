/* `shardlm ckpt info|verify|export`: what a checkpoint holds, whether every checksum
 * matches, and its weights as a Hugging Face directory (safetensors, config.json,
 * generation_config.json and the tokenizer files the checkpoint kept); a LoRA
 * checkpoint's as a PEFT adapter directory, or merged into its base (--merged). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mpi.h>

#include "io/ckpt_hdf5.h"
#include "io/hf_model.h"
#include "io/peft_adapter.h"
#include "io/safe_file.h"
#include "io/safetensors.h"
#include "kernels/check.h"
#include "src/base/agree.h"
#include "src/base/numbers.h"
#include "src/ckpt/checkpoint.h"
#include "src/ckpt/hf_files.h"
#include "src/ckpt/lora_export.h"
#include "src/ckpt/tensors.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"
#include "src/engine/adapters.h"
#include "src/job/lora_keys.h"
#include "src/model/family.h"
#include "src/tokenizer/tokenizer.h"

static void ckpt_usage(FILE *out) {
    fprintf(out,
            "usage: shardlm ckpt info CKPT [--job]     step, tokens, strategy, world size, tensors\n"
            "       shardlm ckpt verify CKPT           recompute every dataset's checksum\n"
            "       shardlm ckpt export CKPT DIR [--dtype f32|bf16|f16] [--shard-size BYTES]\n"
            "                                          a Hugging Face directory: safetensors,\n"
            "                                          config.json, generation_config.json and\n"
            "                                          the tokenizer files the checkpoint kept;\n"
            "                                          of a LoRA checkpoint, a PEFT adapter\n"
            "                                          (adapter_config.json, fp32\n"
            "                                          adapter_model.safetensors)\n"
            "       shardlm ckpt export --merged CKPT DIR [--base DIR] [--dtype ...]\n"
            "                                          [--shard-size ...]\n"
            "                                          a LoRA checkpoint's adapters merged into\n"
            "                                          its base (the recorded model.init_from,\n"
            "                                          or --base: same fingerprint), as a model\n"
            "  CKPT is a step_<N>.h5 file or a checkpoint directory (its `latest` is used).\n"
            "  Run alone or under mpirun (verify and export then read in parallel).\n");
}

static int rank_of(void) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* One error line from rank 0 (every rank has the same message). */
static int fail(int status, const char *msg) {
    return cli_fail("ckpt", status, "%s", msg);
}

/* Opens CKPT (a file or a directory's `latest`). */
static int open_ckpt(const char *arg, ckpt_h5_file *f, char *path, size_t pathlen,
                     model_shape *shape, ckpt_state *st, char *err, size_t errlen) {
    if (checkpoint_resolve("", arg, path, pathlen, err, errlen) != 0) return -1;
    const int ok = checkpoint_open(f, path, MPI_COMM_WORLD, shape, st, err, errlen) == 0;
    /* every rank reads the same file: a failure is everyone's */
    if (ranks_agree(MPI_COMM_WORLD, ok, err, errlen) == 0) return 0;
    char ignored[64];
    ckpt_h5_close(f, ignored, sizeof ignored);
    return -1;
}

/* Sums a chunk; a NaN or an infinity fails it (a load would refuse the dataset). */
static int sum_chunk(void *ctx, const float *x, uint64_t first, uint64_t count, char *err,
                     size_t errlen) {
    const uint64_t bad = ckpt_h5_sum_add(ctx, x, first, count);
    if (bad)
        snprintf(err, errlen, "%llu non-finite values (NaN or infinite) in elements [%llu, %llu)",
                 (unsigned long long)bad, (unsigned long long)first,
                 (unsigned long long)(first + count));
    return bad ? -1 : 0;
}

/* ---------------------------------------------------------------- info */

static void print_bytes(char *out, size_t len, double b) {
    if (b >= 1e9) snprintf(out, len, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(out, len, "%.2f MB", b / 1e6);
    else snprintf(out, len, "%.1f kB", b / 1e3);
}


/* A mixture's files as the checkpoint keeps them: each one's weight, position and file. */
static void print_mixture(const ckpt_state *st) {
    data_mix_saved saved[DATA_MIX_MAX];
    int n = 0;
    char why[400];
    printf("  %-20s %s\n", "data.train", st->data_train);
    if (data_mix_state_parse(st->data_sources, saved, &n, why, sizeof why) != 0) {
        printf("  %-20s unreadable: %s\n", "", why);
        return;
    }
    for (int i = 0; i < n; i++)
        printf("  %-20s weight %.4f, %llu windows taken (%llu since the weights took effect), "
               "%s (%llu bytes, fingerprint %016llx)\n", i ? "" : "sources", saved[i].weight,
               (unsigned long long)saved[i].drawn, (unsigned long long)saved[i].sched,
               saved[i].path, (unsigned long long)saved[i].bytes,
               (unsigned long long)saved[i].fingerprint);
}
static int ckpt_info(int argc, char **argv) {
    const char *arg = NULL;
    int show_job = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--job") == 0) show_job = 1;
        else if (argv[i][0] == '-' || arg) return ckpt_usage(stderr), 2;
        else arg = argv[i];
    }
    if (!arg) return ckpt_usage(stderr), 2;
    char err[1536] = "", path[2048];
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    model_shape m;
    ckpt_state st;
    if (open_ckpt(arg, &f, path, sizeof path, &m, &st, err, sizeof err) != 0) return fail(1, err);
    ckpt_tensors dl;
    ckpt_tensors_of_shape(&dl, &m, &st);
    char *created = NULL, *version = NULL, *job = NULL, *job_path = NULL;
    int ok = ckpt_h5_attr_read_str(&f, "/", "created_utc", &created, err, sizeof err) == 0 &&
             ckpt_h5_attr_read_str(&f, "/", "shardlm_version", &version, err, sizeof err) == 0 &&
             ckpt_h5_attr_read_str(&f, "/", "job_text", &job, err, sizeof err) == 0 &&
             ckpt_h5_attr_read_str(&f, "/", "job_path", &job_path, err, sizeof err) == 0;
    const int me = rank_of();
    if (ok && me == 0) {
        printf("checkpoint %s\n", path);
        printf("  %-20s %lld (%lld updates applied, %lld steps skipped as not finite)\n",
               "step", (long long)st.step, (long long)st.adamw_step,
               (long long)(st.step - st.adamw_step));
        printf("  %-20s %lld\n", "tokens_seen", (long long)st.tokens_seen);
        printf("  %-20s %llu (next global sample)\n", "data_position",
               (unsigned long long)st.data_position);
        printf("  %-20s %.6e\n", "lr_last", st.lr_last);
        if (st.lr_decay_from >= 0)
            printf("  %-20s cosine from %.6e at step %lld to train.min_lr at step %d "
                   "(extended on a resume)\n", "schedule", st.lr_decay_lr,
                   (long long)st.lr_decay_from + 1, st.steps);
        printf("  %-20s %d (%s)\n", "format_version", st.format_version,
               st.format_version >= 2 ? "state checksum ok" : "no state checksum");
        printf("  %-20s %llu (shuffle %s)\n", "seed", (unsigned long long)st.seed,
               st.shuffle ? "on" : "off");
        printf("  %-20s %d x %d tokens\n", "global_batch", st.global_batch, st.seq_len);
        if (st.data_bytes)
            printf("  %-20s %s (%llu bytes, fingerprint %016llx)\n", "data.train", st.data_train,
                   (unsigned long long)st.data_bytes, (unsigned long long)st.data_fingerprint);
        if (st.lora_rank > 0) {
            char tg[128];
            lora_targets_text((unsigned)st.lora_targets, tg, sizeof tg);
            printf("  %-20s adapters of rank %d on %s%s, alpha %g%s, dropout %g; frozen base %s "
                   "(fingerprint %016llx)\n", "lora", st.lora_rank, tg,
                   st.lora_dora ? " (DoRA)" : "", st.lora_alpha,
                   st.lora_rslora ? " (rsLoRA)" : "", st.lora_dropout, st.lora_base,
                   (unsigned long long)st.lora_base_fingerprint);
        }
        if (st.data_sources[0]) /* a mixture (src/data/data_mix.h) */
            print_mixture(&st);
        printf("  %-20s %s\n", "strategy", st.strategy);
        printf("  %-20s %d (shard group %d, replica group %d)\n", "world_size", st.world_size,
               st.shard_size, st.replica_size);
        /* the model line: the keys of the shape; the settings line: the family's other
         * [model] keys (norms, RoPE, initialisation) */
        char shape[600] = "", settings[600] = "", v[64];
        const model_family *fam = m.family;
        for (int k = 0; k < fam->n_keys; k++) {
            const key_def *key = &fam->keys[k];
            char *line = (key->flags & (KF_LAYOUT | KF_SHAPE)) ||
                                 strcmp(key->key, "max_seq_len") == 0
                             ? shape
                             : settings;
            key_format(key, model_shape_cdata(&m), v, sizeof v);
            snprintf(line + strlen(line), sizeof shape - strlen(line), "%s%s %s",
                     line[0] ? ", " : "", key->key, v);
        }
        printf("  %-20s %s: %s; %lld parameters\n", "model", fam->name, shape,
               (long long)model_shape_param_count(&m));
        printf("  %-20s %s\n", "model settings", settings);
        printf("  %-20s %s (shardlm %s, %s)\n", "job", job_path, version, created);
    }
    uint64_t total = 0;
    int n = 0;
    for (int k = 0; ok && k < FSDP_STATE_N; k++) {
        for (int i = 0; ok && i < dl.n; i++) {
            char shape[48], sz[32];
            ckpt_h5_dataset d;
            uint64_t sum = 0;
            ok = ckpt_open_dataset(&f, &dl, k, i, &d, &sum, err, sizeof err) == 0;
            if (!ok) break;
            if (d.ndim == 2)
                snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)d.shape[0], (long long)d.shape[1]);
            else
                snprintf(shape, sizeof shape, "[%lld]", (long long)d.shape[0]);
            print_bytes(sz, sizeof sz, d.numel * 4.0);
            if (me == 0) {
                if (n == 0) printf("  %-58s %-14s %10s  %s\n", "dataset (fp32)", "shape", "size", "checksum");
                printf("  %-58s %-14s %10s  0x%016llx\n", d.path, shape, sz, (unsigned long long)sum);
            }
            total += d.numel * 4;
            n++;
            ckpt_h5_close_dataset(&d);
        }
    }
    /* the Hugging Face files kept for export, each read and checked */
    hf_files hf = {0};
    if (ok) ok = checkpoint_read_hf(&f, &hf, err, sizeof err) == 0;
    for (int i = 0; ok && me == 0 && i < hf.n; i++) {
        char dpath[256], sz[32];
        snprintf(dpath, sizeof dpath, "/hf/%s", hf.f[i].name);
        print_bytes(sz, sizeof sz, (double)hf.f[i].size);
        printf("  %-58s %-14s %10s  0x%016llx\n", dpath, "(bytes)", sz,
               (unsigned long long)ckpt_h5_bytes_checksum(hf.f[i].data, hf.f[i].size));
        total += hf.f[i].size;
        n++;
    }
    hf_files_free(&hf);
    if (ok && me == 0) {
        char sz[32];
        print_bytes(sz, sizeof sz, (double)total);
        printf("  %d datasets, %s\n", n, sz);
        if (show_job) printf("--- job text ---\n%s\n---\n", job);
    }
    free(created);
    free(version);
    free(job);
    free(job_path);
    ckpt_tensors_free(&dl);
    char ignored[64];
    ckpt_h5_close(&f, ignored, sizeof ignored);
    return ok ? 0 : fail(1, err);
}

/* ---------------------------------------------------------------- verify */

static int ckpt_verify(int argc, char **argv) {
    if (argc != 1 || argv[0][0] == '-') return ckpt_usage(stderr), 2;
    char err[1536] = "", path[2048];
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    model_shape m;
    ckpt_state st;
    if (open_ckpt(argv[0], &f, path, sizeof path, &m, &st, err, sizeof err) != 0)
        return fail(1, err);
    const double t0 = MPI_Wtime();
    int world, me = rank_of();
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ckpt_tensors dl;
    ckpt_tensors_of_shape(&dl, &m, &st);
    float *buf = malloc((size_t)CKPT_CHUNK_ELEMS * sizeof(float));
    SHLM_CHECK_ALLOC(buf);
    int ok = 1, bad = 0, n = 0;
    uint64_t total = 0;
    for (int k = 0; ok && k < FSDP_STATE_N; k++) {
        for (int i = 0; ok && i < dl.n; i++) {
            ckpt_h5_dataset d;
            uint64_t stored = 0;
            ok = ckpt_open_dataset(&f, &dl, k, i, &d, &stored, err, sizeof err) == 0;
            if (!ok) break;
            /* rank r sums elements [r·n/W, (r+1)·n/W) */
            uint64_t lo = d.numel * (uint64_t)me / (uint64_t)world;
            uint64_t hi = d.numel * (uint64_t)(me + 1) / (uint64_t)world;
            uint64_t most = (d.numel + (uint64_t)world - 1) / (uint64_t)world;
            uint64_t calls = (most + CKPT_CHUNK_ELEMS - 1) / CKPT_CHUNK_ELEMS;
            ckpt_h5_sum s = {0, 0};
            int rok = ckpt_read_chunks(&f, &d, lo, hi, calls, buf, sum_chunk, &s, err,
                                       sizeof err) == 0;
            /* the lowest failing rank's message is the one printed */
            rok = ranks_agree(MPI_COMM_WORLD, rok, err, sizeof err) == 0;
            uint64_t sums[2] = {s.s1, s.s2};
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
            s.s1 = sums[0], s.s2 = sums[1];
            uint64_t got = ckpt_h5_sum_final(&s, d.numel);
            if (!rok) {
                bad++;
                cli_fail("ckpt verify", 1, "%s: %s", d.path, err);
            } else if (got != stored) {
                bad++;
                cli_fail("ckpt verify", 1, "%s: dataset %s is corrupt: checksum 0x%016llx, "
                         "stored 0x%016llx", path, d.path, (unsigned long long)got,
                         (unsigned long long)stored);
            }
            total += d.numel * 4;
            n++;
            ckpt_h5_close_dataset(&d);
        }
    }
    free(buf);
    ckpt_tensors_free(&dl);
    /* the kept Hugging Face files: read whole and checked on every rank */
    hf_files hf = {0};
    if (ok && checkpoint_read_hf(&f, &hf, err, sizeof err) != 0) {
        bad++;
        cli_fail("ckpt verify", 1, "%s", err);
    }
    for (int i = 0; i < hf.n; i++) total += hf.f[i].size, n++;
    hf_files_free(&hf);
    char ignored[64];
    ckpt_h5_close(&f, ignored, sizeof ignored);
    if (!ok) return fail(1, err);
    double dt = MPI_Wtime() - t0;
    if (bad) return cli_fail("ckpt verify", 1, "%s: %d of %d datasets corrupt", path, bad, n);
    if (me == 0)
        printf("verify: %s: %d datasets, %.3f GB, every checksum matches (%.3f s, %.2f GB/s, "
               "%d ranks)\n", path, n, total / 1e9, dt, total / 1e9 / dt, world);
    return 0;
}

/* ---------------------------------------------------------------- export */

typedef struct export_sink {
    safetensors_writer *w; /* rank 0 only */
    safetensors_dtype dtype;
    void *conv;            /* conversion buffer for bf16/f16 */
    ckpt_h5_sum sum;
} export_sink;

static int export_chunk(void *ctx, const float *x, uint64_t first, uint64_t count, char *err,
                        size_t errlen) {
    export_sink *s = ctx;
    ckpt_h5_sum_add(&s->sum, x, first, count);
    if (s->dtype == SAFETENSORS_F32)
        return safetensors_writer_append(s->w, x, count * 4, err, errlen);
    uint16_t *h = s->conv;
    for (uint64_t i = 0; i < count; i++)
        h[i] = s->dtype == SAFETENSORS_BF16 ? safetensors_f32_to_bf16(x[i])
                                            : safetensors_f32_to_f16(x[i]);
    return safetensors_writer_append(s->w, h, count * 2, err, errlen);
}

/* The token ids of an export's config.json and generation_config.json, as a JSON object:
 * bos_token_id, eos_token_id and pad_token_id of the source's config.json where it has
 * them, the others as the exported tokenizer files give them (transformers' reading:
 * src/tokenizer/tokenizer.h); none without either. NULL with err on failure. */
static cJSON *export_ids(const hf_files *hf, const char *out, char *err, size_t errlen) {
    cJSON *ids = cJSON_CreateObject(), *src = NULL;
    const hf_file *cfg = hf_files_get(hf, "config.json");
    if (cfg) src = cJSON_Parse(cfg->data);
    static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, keys[k]);
        if (v) cJSON_AddItemToObject(ids, keys[k], cJSON_Duplicate(v, 1));
    }
    cJSON_Delete(src);
    const int tokenizer_kept = hf_files_get(hf, "tokenizer.json") || hf_files_get(hf, "tokenizer.model");
    if (cJSON_GetArraySize(ids) == 3 || !tokenizer_kept) return ids;
    tokenizer *tok;
    if (tokenizer_open(&tok, out, err, errlen) != 0) {
        cJSON_Delete(ids);
        return NULL;
    }
    int n_eos = 0;
    const int32_t *eos = tokenizer_eos_ids(tok, &n_eos);
    const int32_t one[3] = {tokenizer_bos(tok), n_eos ? eos[0] : -1, tokenizer_pad(tok)};
    for (int k = 0; k < 3; k++) {
        if (cJSON_GetObjectItemCaseSensitive(ids, keys[k]) || one[k] < 0) continue;
        if (k == 1 && n_eos > 1) {
            cJSON *list = cJSON_AddArrayToObject(ids, keys[k]);
            for (int i = 0; i < n_eos; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(eos[i]));
        } else {
            cJSON_AddNumberToObject(ids, keys[k], one[k]);
        }
    }
    tokenizer_free(tok);
    return ids;
}

/* Writes what an export holds beside the weights, on rank 0: the kept files verbatim (the
 * tokenizer's, generation_config.json), config.json for the checkpoint's shape over the
 * source's (its ids and other members kept; else the exported tokenizer's ids), and a
 * generation_config.json of those ids where the source had none. */
static int export_hf_files(const char *out, const hf_files *hf, const model_shape *m,
                           const char *torch_dtype, char *written, size_t writtenlen,
                           char *err, size_t errlen) {
    char path[2200];
    snprintf(written, writtenlen, "config.json");
    for (int i = 0; i < hf->n; i++) {
        if (strcmp(hf->f[i].name, "config.json") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", out, hf->f[i].name);
        if (safe_file_write_all(path, hf->f[i].data, hf->f[i].size, err, errlen) != 0) return -1;
        snprintf(written + strlen(written), writtenlen - strlen(written), ", %s", hf->f[i].name);
    }
    cJSON *ids = export_ids(hf, out, err, errlen);
    if (!ids) return -1;
    /* the source's config.json, else the ids, with the shape written over them */
    const hf_file *src = hf_files_get(hf, "config.json");
    cJSON *j = src ? cJSON_Parse(src->data) : cJSON_Duplicate(ids, 1);
    int rc = 0;
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "%s/config.json: the source's config.json to build on is not a JSON "
                 "object", out);
        cJSON_Delete(j);
        rc = -1;
    }
    if (rc == 0 && m->family->hf_write(model_shape_cdata(m), j, err, errlen) != 0) {
        cJSON_Delete(j);
        rc = -1;
    }
    if (rc == 0) rc = hf_config_save(out, j, torch_dtype, err, errlen);
    if (rc == 0 && !hf_files_get(hf, "generation_config.json")) {
        char *text = cJSON_Print(ids);
        snprintf(path, sizeof path, "%s/generation_config.json", out);
        rc = text ? safe_file_write_all(path, text, strlen(text), err, errlen) : -1;
        if (rc == 0)
            snprintf(written + strlen(written), writtenlen - strlen(written),
                     ", generation_config.json (of the ids)");
        if (!text) snprintf(err, errlen, "generation_config.json: out of memory");
        free(text);
    }
    cJSON_Delete(ids);
    return rc;
}

/* The weights of an earlier export that this one would leave beside its own in the same
 * directory: transformers and shardlm would then load one or the other (transformers
 * prefers model.safetensors, shardlm the index). */
typedef struct stale_weights {
    char **names; /* in the directory */
    int n;
} stale_weights;

static void stale_weights_free(stale_weights *st) {
    for (int i = 0; i < st->n; i++) free(st->names[i]);
    free(st->names);
    st->names = NULL;
    st->n = 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Why name is an earlier export's weights that an export of n_files files (named files[]:
 * model.safetensors alone, or shards and their index; peft: a PEFT adapter's
 * adapter_model.safetensors) does not write; NULL when it is not: any other file, or one
 * this export writes. Shards are named as transformers names them,
 * model-00001-of-00003.safetensors. A model's weights and an adapter's files are each
 * the other form's stale files: transformers loads a directory with adapter_config.json
 * as an adapter. */
static const char *stale_reason(const char *name, char *const *files, int n_files, int peft) {
    static const char *const model_stale = "the weights of an earlier model export; this one "
                                           "is a PEFT adapter";
    if (strcmp(name, PEFT_WEIGHTS_FILE) == 0 || strcmp(name, PEFT_CONFIG_FILE) == 0)
        return peft ? NULL : "an earlier PEFT adapter export's; this one is a whole model, which "
                             "transformers would load as the adapter";
    if (strcmp(name, "model.safetensors") == 0)
        return peft ? model_stale
               : n_files > 1 ? "the weights of an earlier single-file export; this one is sharded"
                             : NULL;
    if (strcmp(name, "model.safetensors.index.json") == 0)
        return peft ? model_stale
               : n_files == 1 ? "the index of an earlier sharded export; this one is one file"
                              : NULL;
    int k, of, end = 0;
    char canon[64];
    if (sscanf(name, "model-%d-of-%d.safetensors%n", &k, &of, &end) != 2 || name[end] ||
        k < 1 || of < 1)
        return NULL;
    snprintf(canon, sizeof canon, "model-%05d-of-%05d.safetensors", k, of);
    if (strcmp(name, canon) != 0) return NULL;
    for (int j = 0; j < n_files; j++)
        if (strcmp(name, files[j]) == 0) return NULL;
    return "a shard of an earlier export that this one does not write";
}

/* Before an export into dir (rank 0): each weights name it writes must be free or a
 * regular file (safe_file_check_target: a FIFO or a device is refused here, before any
 * work), and the earlier export's weights it would leave (stale_reason) are listed in
 * *st, to be removed once the export has succeeded; one that is neither a regular file
 * nor a symbolic link (a directory, a FIFO) could not be, and is refused. */
static int plan_export_dir(const char *dir, char *const *files, int n_files, int peft,
                           stale_weights *st, char *err, size_t errlen) {
    char path[2200];
    static const char *const others[] = {"model.safetensors.index.json", "config.json",
                                         "generation_config.json"};
    static const char *const adapter_others[] = {PEFT_CONFIG_FILE};
    const int n_others = peft ? 1 : 3;
    for (int j = 0; j < n_files + n_others; j++) {
        if (j == n_files && n_files == 1 && !peft) continue; /* one file: no index */
        snprintf(path, sizeof path, "%s/%s", dir,
                 j < n_files ? files[j] : (peft ? adapter_others : others)[j - n_files]);
        if (safe_file_check_target(path, err, errlen) != 0) return -1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!stale_reason(de->d_name, files, n_files, peft)) continue;
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
        char **g = realloc(st->names, (size_t)(st->n + 1) * sizeof *g);
        if (!g || !(g[st->n] = strdup(de->d_name))) {
            if (g) st->names = g;
            snprintf(err, errlen, "out of memory");
            rc = -1;
        } else if (st->names = g, st->n++, !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode)) {
            snprintf(err, errlen, "%.1100s is %s where an earlier export's weights would be (%s): "
                     "it cannot be removed; remove it or export elsewhere", path,
                     safe_file_kind(sb.st_mode), stale_reason(de->d_name, files, n_files, peft));
            rc = -1;
        }
    }
    closedir(d);
    if (st->n > 1) qsort(st->names, (size_t)st->n, sizeof *st->names, cmp_name);
    return rc;
}

/* After a successful export (rank 0): removes what plan_export_dir listed, one line
 * each (a symbolic link is removed, never what it points to). */
static int remove_stale_weights(const char *dir, const stale_weights *st, char *const *files,
                                int n_files, int peft, char *err, size_t errlen) {
    for (int i = 0; i < st->n; i++) {
        char path[2200];
        snprintf(path, sizeof path, "%s/%s", dir, st->names[i]);
        if (unlink(path) != 0 && errno != ENOENT) {
            snprintf(err, errlen, "%.1100s: cannot remove it (%s): %s", path,
                     stale_reason(st->names[i], files, n_files, peft), strerror(errno));
            return -1;
        }
        printf("export: removed %s (%s)\n", path,
               stale_reason(st->names[i], files, n_files, peft));
    }
    return 0;
}

/* An export under way: what its steps share. */
typedef struct export_run {
    ckpt_h5_file f;
    char path[2048];            /* the checkpoint file */
    const char *out;            /* the directory written */
    safetensors_dtype dtype;
    ckpt_tensors dl;            /* the tensors exported, in this order: the checkpoint's
                                 * (a model, or a LoRA checkpoint's adapters), or with
                                 * merge the base's */
    const char *prefix;         /* before each tensor's name in the file (a PEFT adapter's
                                 * PEFT_KEY_PREFIX) */
    int peft;                   /* the form written: a PEFT adapter directory (else a model) */
    lora_merge *merge;          /* --merged: the tensors come from here (rank 0) */
    int *file_of;               /* (dl.n): the safetensors file each tensor goes to */
    char (*fname)[64];          /* (n_files) */
    int n_files;
    unsigned long long total;   /* the bytes of the exported tensors */
    int me;
} export_run;

/* The options of `ckpt export` (export_args). */
typedef struct export_opts {
    const char *arg, *dtype, *base;
    int dtype_given, shard_given, merged;
    unsigned long long shard_size;
} export_opts;

/* The arguments of `ckpt export`: 0, or the exit status (a usage problem). */
static int export_args(int argc, char **argv, const char **out, export_opts *o) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc)
            o->dtype = argv[++i], o->dtype_given = 1;
        else if (strcmp(argv[i], "--merged") == 0) o->merged = 1;
        else if (strcmp(argv[i], "--base") == 0 && i + 1 < argc) o->base = argv[++i];
        else if (strcmp(argv[i], "--shard-size") == 0 && i + 1 < argc) {
            long long bytes;
            char msg[320];
            if (num_option_int("--shard-size", argv[++i], 1, LLONG_MAX, &bytes, msg, sizeof msg))
                return fail(2, msg);
            o->shard_size = (unsigned long long)bytes;
            o->shard_given = 1;
        } else if (argv[i][0] == '-') return ckpt_usage(stderr), 2;
        else if (!o->arg) o->arg = argv[i];
        else if (!*out) *out = argv[i];
        else return ckpt_usage(stderr), 2;
    }
    if (!o->arg || !*out) return ckpt_usage(stderr), 2;
    if (o->base && !o->merged)
        return fail(2, "--base DIR goes with --merged (the base to merge into)");
    return 0;
}

/* The safetensors files: tensors in layout order, a new file when the next tensor would
 * pass shard_size bytes (a tensor larger than that gets a file of its own). */
static void plan_files(export_run *x, unsigned long long shard_size) {
    const size_t esz = safetensors_dtype_size(x->dtype);
    x->file_of = calloc((size_t)x->dl.n, sizeof(int));
    SHLM_CHECK_ALLOC(x->file_of);
    x->n_files = 1;
    unsigned long long in_file = 0;
    for (int i = 0; i < x->dl.n; i++) {
        unsigned long long b = x->dl.list[i].t->numel * esz;
        if (in_file > 0 && in_file + b > shard_size) x->n_files++, in_file = 0;
        x->file_of[i] = x->n_files - 1;
        in_file += b;
        x->total += b;
    }
    x->fname = calloc((size_t)x->n_files, sizeof *x->fname);
    SHLM_CHECK_ALLOC(x->fname);
    for (int j = 0; j < x->n_files; j++) {
        if (x->n_files == 1)
            snprintf(x->fname[j], sizeof x->fname[j], "%s",
                     x->peft ? PEFT_WEIGHTS_FILE : "model.safetensors");
        else snprintf(x->fname[j], sizeof x->fname[j], "model-%05d-of-%05d.safetensors", j + 1,
                      x->n_files);
    }
}

/* Rank 0: begins the file of tensor i (the first of that file) with its tensor list. */
static int begin_file(export_run *x, safetensors_writer *w, int i, const char *const *meta_v,
                      char *err, size_t errlen) {
    static const char *const meta_k[] = {"format", "shardlm_checkpoint", "shardlm_step"};
    int first = i, n = 0;
    while (first + n < x->dl.n && x->file_of[first + n] == x->file_of[i]) n++;
    const char **names = malloc((size_t)n * sizeof *names);
    safetensors_dtype *dts = malloc((size_t)n * sizeof *dts);
    int *nds = malloc((size_t)n * sizeof *nds);
    const int64_t **shapes = malloc((size_t)n * sizeof *shapes);
    SHLM_CHECK_ALLOC(names);
    SHLM_CHECK_ALLOC(dts);
    SHLM_CHECK_ALLOC(nds);
    SHLM_CHECK_ALLOC(shapes);
    for (int j = 0; j < n; j++) {
        char *name = malloc(strlen(x->prefix) + sizeof x->dl.list[first + j].t->name);
        SHLM_CHECK_ALLOC(name);
        sprintf(name, "%s%s", x->prefix, x->dl.list[first + j].t->name);
        names[j] = name;
        dts[j] = x->dtype;
        nds[j] = x->dl.list[first + j].t->ndim;
        shapes[j] = x->dl.list[first + j].t->shape;
    }
    char fp[2200];
    snprintf(fp, sizeof fp, "%s/%s", x->out, x->fname[x->file_of[i]]);
    const int rc = safetensors_writer_begin(w, fp, n, names, dts, nds, shapes, 3, meta_k, meta_v,
                                            err, errlen);
    for (int j = 0; j < n; j++) free((char *)names[j]);
    free(names);
    free(dts);
    free(nds);
    free(shapes);
    return rc;
}

/* Rank 0: tensor i of the merge (src/ckpt/lora_export.h) into whole (its numel), then
 * into the open file in the export's dtype, chunk by chunk. 0, or -1 with err. */
static int write_merged(export_run *x, int i, safetensors_writer *w, float *whole, void *conv,
                        char *err, size_t errlen) {
    const model_tensor *t = x->dl.list[i].t;
    if (lora_merge_tensor(x->merge, t, whole, err, errlen) != 0) return -1;
    export_sink sink = {w, x->dtype, conv, {0, 0}};
    for (uint64_t a = 0; a < t->numel; a += CKPT_CHUNK_ELEMS) {
        const uint64_t cnt = t->numel - a < CKPT_CHUNK_ELEMS ? t->numel - a : CKPT_CHUNK_ELEMS;
        if (export_chunk(&sink, whole + a, a, cnt, err, errlen) != 0) return -1;
    }
    return 0;
}

/* Tensor i of the checkpoint into the open file: rank 0 reads it whole, chunk by chunk,
 * checks its checksum and writes it (while ok); the others join each (collective) read.
 * 1, or 0 with err (on rank 0; every rank when the dataset cannot be opened). */
static int copy_dataset(export_run *x, int i, safetensors_writer *w, float *buf, void *conv,
                        int ok, char *err, size_t errlen) {
    const int me = x->me;
    ckpt_h5_dataset d;
    uint64_t stored = 0;
    const int rok = ckpt_open_dataset(&x->f, &x->dl, FSDP_STATE_MASTER, i, &d, &stored, err,
                                      errlen) == 0;
    if (ranks_agree(MPI_COMM_WORLD, rok, err, errlen) != 0) {
        ckpt_h5_close_dataset(&d);
        return 0;
    }
    export_sink sink = {w, x->dtype, conv, {0, 0}};
    uint64_t calls = (d.numel + CKPT_CHUNK_ELEMS - 1) / CKPT_CHUNK_ELEMS;
    int cok = ckpt_read_chunks(&x->f, &d, 0, me == 0 && ok ? d.numel : 0, calls, buf,
                               me == 0 ? export_chunk : NULL, &sink, err, errlen) == 0;
    /* a tensor read whole (not cut short by a failed write) must match its checksum:
     * only then is a mismatch the source's fault */
    if (me == 0 && ok && cok && ckpt_h5_sum_final(&sink.sum, d.numel) != stored) {
        snprintf(err, errlen, "%.1000s: dataset %.256s is corrupt: checksum mismatch", x->path,
                 d.path);
        cok = 0;
    }
    ckpt_h5_close_dataset(&d);
    return ok && cok;
}

/* Every tensor of the list into the safetensors files, from the checkpoint (copy_dataset)
 * or, merged, made whole by rank 0 (write_merged). 1, or 0 with err on rank 0 (and the
 * failed file abandoned). */
static int write_tensors(export_run *x, const char *const *meta_v, char *err, size_t errlen) {
    const int me = x->me, nt = x->dl.n;
    float *buf = malloc((size_t)CKPT_CHUNK_ELEMS * sizeof(float));
    void *conv =
        safetensors_dtype_size(x->dtype) == 2 ? malloc((size_t)CKPT_CHUNK_ELEMS * 2) : NULL;
    SHLM_CHECK_ALLOC(buf);
    float *whole = NULL; /* merged: the largest tensor */
    if (x->merge && me == 0) {
        size_t most = 1;
        for (int i = 0; i < nt; i++)
            if (x->dl.list[i].t->numel > most) most = x->dl.list[i].t->numel;
        whole = malloc(most * sizeof(float));
        SHLM_CHECK_ALLOC(whole);
    }
    safetensors_writer w;
    memset(&w, 0, sizeof w);
    int ok = 1, open_file = -1;
    for (int i = 0; i < nt; i++) {
        if (me == 0 && ok && x->file_of[i] != open_file) {
            ok = begin_file(x, &w, i, meta_v, err, errlen) == 0;
            open_file = x->file_of[i];
        }
        if (!x->merge) ok = copy_dataset(x, i, &w, buf, conv, ok, err, errlen);
        else if (me == 0 && ok) ok = write_merged(x, i, &w, whole, conv, err, errlen) == 0;
        MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
        if (!ok) break;
        if (me == 0 && (i + 1 == nt || x->file_of[i + 1] != open_file))
            ok = safetensors_writer_finish(&w, err, errlen) == 0;
        MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
        if (!ok) break;
    }
    if (me == 0 && !ok) safetensors_writer_abort(&w);
    free(buf);
    free(conv);
    free(whole);
    return ok;
}

/* Rank 0: model.safetensors.index.json, where the tensors span several files. */
static int write_index(const export_run *x, char *err, size_t errlen) {
    const int nt = x->dl.n;
    const char **names = malloc((size_t)nt * sizeof *names);
    const char **files = malloc((size_t)nt * sizeof *files);
    SHLM_CHECK_ALLOC(names);
    SHLM_CHECK_ALLOC(files);
    for (int i = 0; i < nt; i++) {
        names[i] = x->dl.list[i].t->name;
        files[i] = x->fname[x->file_of[i]];
    }
    const int rc = hf_index_write(x->out, nt, names, files, x->total, err, errlen);
    free(names);
    free(files);
    return rc;
}

/* A LoRA checkpoint's adapter_config.json (PEFT's names for its targets, over the base's
 * layout) from its state. */
static void export_peft_config(const model_shape *m, const ckpt_state *st, peft_config *pc) {
    memset(pc, 0, sizeof *pc);
    pc->r = st->lora_rank;
    pc->lora_alpha = st->lora_alpha;
    pc->lora_dropout = st->lora_dropout;
    pc->use_rslora = st->lora_rslora;
    pc->use_dora = st->lora_dora;
    snprintf(pc->base_model, sizeof pc->base_model, "%s", st->lora_base);
    model_desc md;
    model_shape_desc_open(&md, m);
    for (int t = 0; t < MODEL_N_TARGETS && pc->n_modules < PEFT_MAX_MODULES; t++)
        if ((st->lora_targets & 1 << t) &&
            adapters_module_name(&md.lay, t, pc->modules[pc->n_modules], 64) == 0)
            pc->n_modules++;
    model_desc_close(&md);
}

/* What the checkpoint and the options say to write: the form (x->peft, x->merge's need)
 * and, for --merged, the merge opened (the base checked). 0, or -1 with err (every rank). */
static int export_form(export_run *x, const export_opts *o, const model_shape *m,
                       const ckpt_state *st, char *err, size_t errlen) {
    if (st->lora_rank == 0) {
        if (!o->merged) return 0;
        snprintf(err, errlen, "--merged: %.1200s is a full checkpoint (no LoRA adapters to merge): "
                 "export it without --merged", x->path);
        return -1;
    }
    if (st->lora_alpha <= 0) {
        snprintf(err, errlen, "%.1200s holds LoRA adapters but not lora.alpha (a format-%d file, "
                 "from before checkpoints kept it): the adapters' scale is unknown, so neither "
                 "a PEFT adapter nor a merged model can be written", x->path, st->format_version);
        return -1;
    }
    if (!o->merged) {
        if (o->dtype_given || o->shard_given) {
            snprintf(err, errlen, "%s: a LoRA checkpoint exports as a PEFT adapter, one "
                     "%s of fp32 tensors (the master weights); --merged writes a model",
                     o->dtype_given ? "--dtype" : "--shard-size", PEFT_WEIGHTS_FILE);
            return -1;
        }
        x->peft = 1;
        x->prefix = PEFT_KEY_PREFIX;
        return 0;
    }
    const char *base = o->base ? o->base : st->lora_base;
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", base);
    int found = x->me != 0 || access(cfg, R_OK) == 0;
    MPI_CHECK(MPI_Bcast(&found, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!found) {
        snprintf(err, errlen, "--merged: the base %.600s%s is not a Hugging Face directory (no "
                 "readable config.json): name the base %.400s was trained on with --base DIR",
                 base, o->base ? "" : " that the checkpoint records", x->path);
        return -1;
    }
    return lora_merge_open(&x->merge, &x->f, x->path, m, st, base, err, errlen);
}

static int ckpt_export(int argc, char **argv) {
    /* shard size: transformers' default max_shard_size */
    export_opts o = {.dtype = "f32", .shard_size = 5000000000ull};
    export_run x = {.f = {.file = -1, .dxpl = -1}, .prefix = "", .me = rank_of()};
    const int usage = export_args(argc, argv, &x.out, &o);
    if (usage) return usage;
    const char *torch_dtype;
    if (strcmp(o.dtype, "f32") == 0) x.dtype = SAFETENSORS_F32, torch_dtype = "float32";
    else if (strcmp(o.dtype, "bf16") == 0) x.dtype = SAFETENSORS_BF16, torch_dtype = "bfloat16";
    else if (strcmp(o.dtype, "f16") == 0) x.dtype = SAFETENSORS_F16, torch_dtype = "float16";
    else return fail(2, "--dtype must be f32, bf16 or f16");

    char err[1536] = "";
    const int me = x.me;
    model_shape m;
    ckpt_state st;
    if (open_ckpt(o.arg, &x.f, x.path, sizeof x.path, &m, &st, err, sizeof err) != 0)
        return fail(1, err);
    const double t0 = MPI_Wtime();
    int ok = export_form(&x, &o, &m, &st, err, sizeof err) == 0;
    if (ok) {
        ok = me != 0 || safe_file_mkdir_p(x.out, err, sizeof err) == 0;
        MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
        if (!ok && me != 0) snprintf(err, sizeof err, "cannot create the output directory");
    }
    if (!ok) {
        lora_merge_close(x.merge);
        char ignored[64];
        ckpt_h5_close(&x.f, ignored, sizeof ignored);
        return fail(1, err);
    }

    /* merged: the base's tensors; else the checkpoint's (a LoRA checkpoint's: its adapters) */
    ckpt_tensors_of_shape(&x.dl, &m, x.merge ? NULL : &st);
    plan_files(&x, x.peft ? ULLONG_MAX : o.shard_size);
    /* the names the export writes: free or regular files, and what an earlier export left
     * beside them (removed once this one has succeeded) */
    char **names = malloc((size_t)x.n_files * sizeof *names);
    SHLM_CHECK_ALLOC(names);
    for (int j = 0; j < x.n_files; j++) names[j] = x.fname[j];
    stale_weights stale = {0};
    ok = me != 0 || plan_export_dir(x.out, names, x.n_files, x.peft, &stale, err, sizeof err) == 0;
    MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)st.step);
    const char *const meta_v[] = {"pt", x.path, step};
    if (ok) ok = write_tensors(&x, meta_v, err, sizeof err);
    if (me == 0 && ok && x.n_files > 1) ok = write_index(&x, err, sizeof err) == 0;
    /* the new weights are whole: an earlier export's other ones go */
    if (me == 0 && ok)
        ok = remove_stale_weights(x.out, &stale, names, x.n_files, x.peft, err, sizeof err) == 0;
    stale_weights_free(&stale);
    free(names);
    char written[512] = "";
    if (x.peft) {
        /* a PEFT adapter: its adapter_config.json beside the tensors */
        peft_config pc;
        export_peft_config(&m, &st, &pc);
        if (me == 0 && ok) {
            ok = peft_config_write(x.out, &pc, err, sizeof err) == 0;
            snprintf(written, sizeof written, "%s", PEFT_CONFIG_FILE);
        }
    } else {
        /* the files the checkpoint kept (collective: every rank reads and checks them) */
        hf_files hf = {0};
        if (ok) ok = checkpoint_read_hf(&x.f, &hf, err, sizeof err) == 0;
        if (me == 0 && ok) {
            ok = export_hf_files(x.out, &hf, &m, torch_dtype, written, sizeof written, err,
                                 sizeof err) == 0;
        }
        hf_files_free(&hf);
    }
    MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (me == 0 && ok) {
        double dtime = MPI_Wtime() - t0;
        printf("export: %s (step %lld) -> %s%s: %d tensors in %d file%s (%s), %s; %.3f GB in "
               "%.3f s = %.2f GB/s\n", x.path, (long long)st.step, x.out,
               x.peft ? " (PEFT adapter)" : x.merge ? " (adapters merged into the base)" : "",
               x.dl.n, x.n_files, x.n_files > 1 ? "s + model.safetensors.index.json" : "",
               x.peft ? "f32" : o.dtype, written, x.total / 1e9, dtime, x.total / 1e9 / dtime);
    }
    free(x.fname);
    free(x.file_of);
    ckpt_tensors_free(&x.dl);
    lora_merge_close(x.merge);
    char ignored[64];
    ckpt_h5_close(&x.f, ignored, sizeof ignored);
    if (!ok) return fail(1, me == 0 ? err : "export failed");
    return 0;
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (rank_of() == 0) ckpt_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 2; i < argc; i++) /* a subcommand's --help: the usage, which covers all three */
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank_of() == 0) ckpt_usage(stdout);
            return 0;
        }
    if (strcmp(argv[1], "info") == 0) return ckpt_info(argc - 2, argv + 2);
    if (strcmp(argv[1], "verify") == 0) return ckpt_verify(argc - 2, argv + 2);
    if (strcmp(argv[1], "export") == 0) return ckpt_export(argc - 2, argv + 2);
    cli_fail("ckpt", 2, "unknown subcommand '%s'", argv[1]);
    if (rank_of() == 0) ckpt_usage(stderr);
    return 2;
}
