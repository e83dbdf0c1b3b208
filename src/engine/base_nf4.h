/* QLoRA's frozen base: how one unit's base is stored when lora.base_dtype = nf4 (its
 * projection matrices as NF4, kernels/nf4.h; the rest in fsdp.param_dtype), sharded on
 * block boundaries, gathered as those bytes and unpacked into the act-dtype unit. Pure
 * layout arithmetic (shard_plan.c sizes it) and the host side of the engine's store
 * (fsdp.c allocates, gathers and dequantizes it). */
#ifndef SHLM_BASE_NF4_H
#define SHLM_BASE_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/nf4.h"
#include "src/engine/model.h"

/* One NF4 matrix of a unit: the unit's tensor `tensor` at [offset, offset + numel) of its
 * flat buffer, quantized on its own from its first value as bitsandbytes' quantize_4bit
 * quantizes the whole tensor, and cut into quanta (values a quantum, base_nf4_unit) that
 * are numbered [q0, q0 + nq) across the unit's NF4 matrices. */
typedef struct base_nf4_tensor {
    int tensor;
    size_t offset, numel;
    size_t q0, nq;
} base_nf4_tensor;

enum { BASE_NF4_MAX_RUNS = MODEL_MAX_UNIT_TENSORS + 1 };

/* One unit's stored base. Its NF4 matrices are the tensors a LoRA target marks (the seven
 * projections: bitsandbytes' Linear4bit replaces every nn.Linear of the decoder layers);
 * everything else of the unit (norms, biases; the whole embedding or head unit) is "the
 * rest", packed in flat order and stored in param_dtype.
 *
 * A quantum is the unit the matrices are sharded in: one block of 64 values, or with
 * double quant one group of 256 blocks (64·256 values), so that a rank's part of a matrix is
 * a whole number of blocks of the matrix's own quantization (a partial last quantum holds
 * the matrix's partial last block and group, as quantize_4bit makes them). The unit's
 * quanta are padded to a multiple of S and each rank keeps q_shard consecutive ones; the
 * rest is sharded as a flat buffer is (shard_numel). A rank's store is one byte block,
 * the same size on every rank, what the gather moves:
 *
 *   [ rest (rest_shard param_dtype) | codes (q_shard · quantum/2 bytes) |
 *     plain: absmax (q_shard fp32) ; double quant: absmax codes (q_shard · 256 bytes),
 *     absmax2 (q_shard fp32), the matrices' offsets (n_nf4 fp32, every rank) ]
 *
 * Every part starts 4-byte aligned and block_bytes is a multiple of 4. */
typedef struct base_nf4_unit {
    int n_nf4;                       /* NF4 matrices (0: the unit is stored as without NF4) */
    base_nf4_tensor t[MODEL_N_TARGETS];
    int n_runs;                      /* the rest: runs of the flat buffer, in order */
    size_t run_offset[BASE_NF4_MAX_RUNS], run_count[BASE_NF4_MAX_RUNS];
    size_t rest_numel, rest_shard;   /* the rest's elements, and each rank's (padded) */
    int double_quant;
    size_t quantum;                  /* values a quantum: 64, or 64·256 with double quant */
    size_t quanta, q_shard;          /* the unit's quanta, and each rank's (padded to S) */
    size_t codes_at, scales_at, absmax2_at, offsets_at; /* byte offsets in a block (every
                                      * rank's holds every matrix's offset) */
    size_t block_bytes;              /* a rank's store */
} base_nf4_unit;

/* The storage of unit lu over S ranks, the rest in dtype of param_size bytes an element. */
void base_nf4_unit_plan(const model_unit *lu, int S, int double_quant, size_t param_size,
                        base_nf4_unit *out);

/* Rank r's block (host, block_bytes, param_dtype bf16 when param_size is 2 else fp32) from
 * the whole unit's values x (host fp32, lu->numel): its slice of the packed rest, rounded to
 * nearest even in bf16; each NF4 matrix quantized whole (the same codes on every rank and at
 * every world size) and its quanta of it kept. Padding bytes are zero. Returns 0, or -1 when
 * a matrix holds a NaN or an infinity (its value index in *bad_tensor, *bad_index). */
int base_nf4_block_make(const base_nf4_unit *nu, int r, size_t param_size, const float *x,
                        uint8_t *block, int *bad_tensor, size_t *bad_index);

/* A piece of rank r's block to unpack into the gathered unit: NF4 (q set: a view of the
 * matrix's values [value0, value0 + q.n) that starts on a quantum, its arrays pointing into
 * `block`) or a run of the rest (q.n = 0: `count` param_dtype elements at byte `src` of the
 * block). Either way they land at element `dst` of the unit. */
typedef struct base_nf4_piece {
    shlm_nf4 q;
    size_t src, count;
    size_t dst;
} base_nf4_piece;
/* Rank r's pieces of the unit from its block at `block` (host or backend memory: only
 * pointer arithmetic), into out (at most BASE_NF4_MAX_PIECES); returns their number. */
enum { BASE_NF4_MAX_PIECES = BASE_NF4_MAX_RUNS + MODEL_N_TARGETS };
int base_nf4_pieces(const base_nf4_unit *nu, int r, size_t param_size, uint8_t *block,
                    base_nf4_piece *out);

/* This rank's part of the base fingerprint (fsdp.h) for an NF4 unit, from its host block:
 * Σ hash(at + i, bits of x_i) over its rest elements i (x_i the stored value widened to fp32,
 * as a param_dtype base hashes), plus, for the NF4 matrices, the codes and scales as stored:
 * a term per value (its 4-bit code), per block (its absmax bits, or its 8-bit absmax code),
 * per double-quant group (its absmax2 bits) and per matrix (its offset bits, counted by rank
 * 0), each keyed by its first value's place at + i and a salt of its kind. The sum over the
 * ranks is the same at every world size. */
uint64_t base_nf4_fingerprint(const base_nf4_unit *nu, int r, size_t param_size,
                              const uint8_t *block, uint64_t at);

#endif
