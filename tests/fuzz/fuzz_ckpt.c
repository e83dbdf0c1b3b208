/* Fuzzes shardlm checkpoints (src/ckpt/load.c checkpoint_open and checkpoint_load,
 * src/cli/cmd_ckpt.c `ckpt info` and `ckpt verify`), in one process that is an MPI singleton.
 * Input, by its first byte:
 *   even: the rest is an HDF5 file's bytes (what HDF5 itself makes of damage);
 *   odd:  the rest is edits of a valid checkpoint that LLVMFuzzerInitialize saves from a
 *         tiny model (what shardlm makes of metadata it must not trust): up to 16 edits of
 *         10 bytes, kind, index, 8 bytes of value (little-endian), applied through HDF5:
 *           0 root attribute [index] := the value as int64    1 ... as double
 *           2 ... := the value as an 8-byte string             3 delete it
 *           4 dataset [index]'s checksum := the value          5 delete the dataset
 *           6 element (value mod numel) of dataset [index] := the value's low 32 bits
 *           7 dataset [index] := a soft link to dataset [value]
 *           8 dataset [index] := fp32 [value mod 64 + 1] zeros
 *         with the attribute and dataset lists read from the saved file, so the edits
 *         follow whatever the format holds.
 * Every reader must fail with one line or succeed; info and verify run only on shapes of
 * at most 2^22 parameters (larger ones would only measure how much memory there is). */
#include <mpi.h>

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/ckpt_hdf5.h"
#include "kernels/comm.h"
#include "kernels/cpu/cpu.h"
#include "src/ckpt/checkpoint.h"
#include "src/job/config.h"
#include "src/cli/commands.h"
#include "src/families/families.h"
#include "src/model/decoder.h"
#include "tests/fuzz/fuzz.h"

enum { MAX_EDITS = 16, EDIT_BYTES = 10, MAX_NAMES = 256 };

static topology topo;
static fsdp_engine *engine;
static model_shape shape; /* dshape, a Llama shape */
static const decoder_config dshape = {.dim = 16, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                             .head_dim = 8, .ffn_dim = 32, .vocab_size = 32, .max_seq_len = 16,
                             .norm_eps = 1e-5f, .rope_theta = 10000.0f, .init_std = 0.02f};
static unsigned char *tmpl;
static size_t tmpl_size;
static char *attrs[MAX_NAMES], *datasets[MAX_NAMES];
static int n_attrs, n_datasets;

static herr_t list_attr(hid_t obj, const char *name, const H5A_info_t *info, void *op) {
    (void)obj, (void)info, (void)op;
    if (n_attrs < MAX_NAMES) attrs[n_attrs++] = strdup(name);
    return 0;
}

static herr_t list_dataset(hid_t obj, const char *name, const H5O_info_t *info, void *op) {
    (void)obj, (void)op;
    if (info->type == H5O_TYPE_DATASET && n_datasets < MAX_NAMES) {
        char *p = malloc(strlen(name) + 2);
        sprintf(p, "/%s", name);
        datasets[n_datasets++] = p;
    }
    return 0;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "fuzz_ckpt: set-up: %s: %s\n", what, err);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setenv("OMP_NUM_THREADS", "1", 1);
    MPI_Init(argc, argv);
    char err[1536] = "";
    topology_options topt = {.strategy = FSDP_FULL_SHARD};
    if (topology_create(&topo, MPI_COMM_WORLD, &topt, err, sizeof err) != 0) die("topology", err);
    /* the model and its plan live as long as the engine: the whole fuzzing run */
    static model_desc md;
    static shard_plan plan;
    family_shape_defaults(family_named("llama"), &shape);
    memcpy(model_shape_data(&shape), &dshape, sizeof dshape);
    model_shape_desc_open(&md, &shape);
    shard_plan_build(&plan, &md, &(plan_params){.strategy = topo.strategy, .S = topo.shard_size,
                                                .R = topo.replica_size, .B = 1, .T = 8});
    fsdp_options opt = {.prefetch = 1};
    engine = fsdp_create(&md, &plan, &shlm_ops_cpu, &shlm_comm_mpi, &topo, &opt, 7);
    /* the template's job: a real job file through the real loader, so every value the save
     * records is one a load accepts */
    char job_path[600];
    snprintf(job_path, sizeof job_path, "%s/template.ini", fuzz_dir());
    FILE *jf = fopen(job_path, "w");
    if (!jf) die(job_path, "cannot write");
    fprintf(jf, "[model]\ndim = %d\nn_layers = %d\nn_heads = %d\nn_kv_heads = %d\nffn_dim = %d\n"
            "vocab_size = %d\nmax_seq_len = %d\n[train]\nseq_len = 8\nsteps = 4\nseed = 7\n"
            "global_batch = 2\n[data]\ntrain = unused.bin\n", dshape.dim, dshape.n_layers,
            dshape.n_heads, dshape.n_kv_heads, dshape.ffn_dim, dshape.vocab_size,
            dshape.max_seq_len);
    fclose(jf);
    job_config jc;
    if (job_config_load(&jc, job_path, 0, NULL, err, sizeof err) != 0) die("job", err);
    jc.model = shape;
    ckpt_state st = {.step = 1, .adamw_step = 1, .seed = 7, .global_batch = 2, .seq_len = 8,
                     .steps = 4, .lr_last = 1e-3, .lr_decay_from = -1};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/template", fuzz_dir());
    if (checkpoint_save(engine, &topo, &jc, &st, NULL, dir, 0, err, sizeof err) != 0) die("save", err);
    job_config_free(&jc);
    char path[700];
    snprintf(path, sizeof path, "%s/step_1.h5", dir);
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) die(path, "cannot read");
    tmpl_size = (size_t)ftell(f);
    rewind(f);
    tmpl = malloc(tmpl_size);
    if (!tmpl || fread(tmpl, 1, tmpl_size, f) != tmpl_size) die(path, "cannot read");
    fclose(f);
    hid_t h = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hsize_t at = 0;
    if (h < 0 || H5Aiterate2(h, H5_INDEX_NAME, H5_ITER_INC, &at, list_attr, NULL) < 0 ||
        H5Ovisit(h, H5_INDEX_NAME, H5_ITER_INC, list_dataset, NULL) < 0 || n_attrs == 0 ||
        n_datasets == 0)
        die(path, "cannot list its attributes and datasets");
    H5Fclose(h);
    return 0;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void set_attr(hid_t obj, const char *name, hid_t type, const void *value) {
    if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, type, value);
        H5Aclose(a);
    }
    H5Sclose(space);
}

/* One edit of the kinds listed at the top; HDF5 errors just leave the file as it is. */
static void apply_edit(hid_t h, const uint8_t *e) {
    const char *attr = attrs[e[1] % n_attrs], *ds = datasets[e[1] % n_datasets];
    const uint64_t v = le64(e + 2);
    hid_t d;
    switch (e[0] % 9) {
    case 0: set_attr(h, attr, H5T_NATIVE_INT64, &v); break;
    case 1: {
        double x;
        memcpy(&x, &v, sizeof x);
        set_attr(h, attr, H5T_NATIVE_DOUBLE, &x);
        break;
    }
    case 2: {
        char s[9];
        memcpy(s, e + 2, 8);
        s[8] = '\0';
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, strlen(s) + 1);
        set_attr(h, attr, t, s);
        H5Tclose(t);
        break;
    }
    case 3: H5Adelete(h, attr); break;
    case 4:
        if ((d = H5Dopen2(h, ds, H5P_DEFAULT)) >= 0) {
            set_attr(d, "checksum", H5T_NATIVE_UINT64, &v);
            H5Dclose(d);
        }
        break;
    case 5: H5Ldelete(h, ds, H5P_DEFAULT); break;
    case 6:
        if ((d = H5Dopen2(h, ds, H5P_DEFAULT)) >= 0) {
            hid_t space = H5Dget_space(d);
            hssize_t n = H5Sget_simple_extent_npoints(space);
            int nd = H5Sget_simple_extent_ndims(space);
            hsize_t dims[8] = {0}, at[8] = {0};
            if (n > 0 && nd > 0 && nd <= 8) {
                H5Sget_simple_extent_dims(space, dims, NULL);
                uint64_t k = v % (uint64_t)n;
                for (int i = nd - 1; i >= 0; i--) at[i] = k % dims[i], k /= dims[i];
                uint32_t word = (uint32_t)v;
                hid_t mem = H5Screate(H5S_SCALAR);
                H5Sselect_elements(space, H5S_SELECT_SET, 1, at);
                H5Dwrite(d, H5T_NATIVE_UINT32, mem, space, H5P_DEFAULT, &word);
                H5Sclose(mem);
            }
            H5Sclose(space);
            H5Dclose(d);
        }
        break;
    case 7:
        H5Ldelete(h, ds, H5P_DEFAULT);
        H5Lcreate_soft(datasets[v % (uint64_t)n_datasets], h, ds, H5P_DEFAULT, H5P_DEFAULT);
        break;
    case 8: {
        H5Ldelete(h, ds, H5P_DEFAULT);
        hsize_t n = v % 64 + 1;
        hid_t space = H5Screate_simple(1, &n, NULL);
        d = H5Dcreate2(h, ds, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d >= 0) H5Dclose(d);
        H5Sclose(space);
        break;
    }
    }
}

static int run_ckpt_command(const char *sub, const char *path, const char *flag) {
    char *argv[5] = {"ckpt", (char *)sub, (char *)path, (char *)flag, NULL};
    return cmd_ckpt(flag ? 4 : 3, argv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *path;
    if (data[0] % 2 == 0) {
        path = fuzz_write("step_1.h5", data + 1, size - 1);
    } else {
        path = fuzz_write("step_1.h5", tmpl, tmpl_size);
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        hid_t h = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        if (h < 0) abort();
        for (size_t at = 1, k = 0; at + EDIT_BYTES <= size && k < MAX_EDITS; at += EDIT_BYTES, k++)
            apply_edit(h, data + at);
        H5Fclose(h);
    }

    char err[1536] = "";
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    model_shape stored;
    ckpt_state st;
    int rc = checkpoint_open(&f, path, MPI_COMM_WORLD, &stored, &st, err, sizeof err);
    fuzz_check_error(rc, err, NULL, "checkpoint_open");
    char ignored[256];
    ckpt_h5_close(&f, ignored, sizeof ignored);
    /* an opened shape passed its keys' bounds: its count fits an int64 */
    if (rc == 0 && model_shape_param_count(&stored) <= (1 << 22)) {
        run_ckpt_command("info", path, "--job");
        run_ckpt_command("verify", path, NULL);
    }
    rc = checkpoint_load(engine, &topo, &shape, path, CKPT_LOAD_ALL, &st, err, sizeof err);
    fuzz_check_error(rc, err, NULL, "checkpoint_load");
    return 0;
}
