/* The shardlm side of tests/nf4_ref.sh: quantizes a tensor file with kernels/nf4.c and
 * writes every array of the NF4 format, and the values the cpu backend's nf4_dequantize gives
 * back, as raw files for tests/nf4_ref.py to hold against bitsandbytes.
 *
 * Usage: nf4_dump tables OUTDIR
 *          levels.bin, dq_levels.bin: the two code books (16 and 256 fp32)
 *        nf4_dump fp32|bf16 plain|double IN N OUTDIR
 *          IN: N values, raw little-endian fp32 or bf16. Writes codes.bin, absmax.bin (plain)
 *          or absmax_codes.bin, absmax2.bin, offset.bin (double), and deq.bin: the N values
 *          dequantized in three regions that meet on block boundaries, in the input's dtype
 *          (bf16: the fp32 values through round_to_bf16, as a bf16 gather on the cpu makes
 *          them). Exit 0, 1 on a failure (one line on stderr), 2 on bad usage. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/nf4.h"
#include "kernels/ops.h"

static const char *outdir;

static void *xmalloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "nf4_dump: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void put(const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", outdir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "nf4_dump: cannot write %s\n", path);
        exit(1);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: nf4_dump tables OUTDIR | nf4_dump fp32|bf16 plain|double IN N OUTDIR\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "tables") == 0) {
        outdir = argv[2];
        put("levels.bin", shlm_nf4_code, sizeof shlm_nf4_code);
        put("dq_levels.bin", shlm_nf4_dq_code, sizeof shlm_nf4_dq_code);
        return 0;
    }
    if (argc != 6) return usage();
    const int bf16 = strcmp(argv[1], "bf16") == 0, dq = strcmp(argv[2], "double") == 0;
    if ((!bf16 && strcmp(argv[1], "fp32")) || (!dq && strcmp(argv[2], "plain"))) return usage();
    char *end;
    const size_t n = strtoull(argv[4], &end, 10);
    if (*end || !*argv[4]) return usage();
    outdir = argv[5];

    const size_t esize = bf16 ? 2 : 4, nb = shlm_nf4_blocks(n), ng = shlm_nf4_groups(n);
    void *x = xmalloc(n * esize);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(x, esize, n, f) != n) {
        fprintf(stderr, "nf4_dump: cannot read %zu values from %s\n", n, argv[3]);
        return 1;
    }
    fclose(f);

    shlm_nf4 q = {n, xmalloc(shlm_nf4_code_bytes(n)), NULL, NULL, NULL, NULL};
    if (dq) {
        q.absmax_codes = xmalloc(nb);
        q.absmax2 = xmalloc(ng * sizeof(float));
        q.offset = xmalloc(sizeof(float));
    } else {
        q.absmax = xmalloc(nb * sizeof(float));
    }
    size_t bad = 0;
    const int rc = bf16 ? shlm_nf4_quantize_bf16(&q, x, &bad) : shlm_nf4_quantize(&q, x, &bad);
    if (rc != 0) {
        fprintf(stderr, "nf4_dump: value %zu of %s is not finite\n", bad, argv[3]);
        return 1;
    }
    put("codes.bin", q.codes, shlm_nf4_code_bytes(n));
    if (dq) {
        put("absmax_codes.bin", q.absmax_codes, nb);
        put("absmax2.bin", q.absmax2, ng * sizeof(float));
        put("offset.bin", q.offset, sizeof(float));
    } else {
        put("absmax.bin", q.absmax, nb * sizeof(float));
    }

    /* regions [0, c1), [c1, c2), [c2, n) with c1, c2 on block boundaries */
    const shlm_ops *cpu = &shlm_ops_cpu;
    float *deq = xmalloc(n * sizeof(float));
    const size_t c1 = SHLM_NF4_BLOCK * (nb / 3), c2 = SHLM_NF4_BLOCK * (2 * nb / 3);
    cpu->nf4_dequantize(deq, &q, 0, c1);
    cpu->nf4_dequantize(deq + c1, &q, c1, c2);
    cpu->nf4_dequantize(deq + c2, &q, c2, n);
    if (bf16) {
        uint16_t *h = xmalloc(n * sizeof(uint16_t));
        cpu->round_to_bf16(deq, n);
        cpu->f32_to_bf16(h, deq, n); /* exact: the values are bf16 already */
        put("deq.bin", h, n * sizeof(uint16_t));
    } else {
        put("deq.bin", deq, n * sizeof(float));
    }
    return 0;
}
