/* RoPE's frequencies: the one description of a model's rotary embedding that every rope
 * kernel takes (kernels/ops.h rope, attention_bwd), computed once per model from its rope
 * type and parameters by the rules of transformers' ROPE_INIT_FUNCTIONS. */
#ifndef SHLM_ROPE_FREQ_H
#define SHLM_ROPE_FREQ_H

#include <stddef.h>

/* config.json's rope_type (rope_scaling / rope_parameters); no rope_scaling is default */
typedef enum shlm_rope_type {
    SHLM_ROPE_DEFAULT = 0, /* theta alone */
    SHLM_ROPE_LINEAR = 1,  /* every frequency divided by factor */
    SHLM_ROPE_LLAMA3 = 2   /* Llama 3.1's wavelength bands (shlm_rope_init) */
} shlm_rope_type;

/* A rope type and its parameters, as config.json names them. */
typedef struct shlm_rope_params {
    shlm_rope_type type;
    double theta;                         /* rope_theta: the base */
    double factor;                        /* linear, llama3 */
    double low_freq_factor;               /* llama3 */
    double high_freq_factor;              /* llama3 */
    int original_max_position_embeddings; /* llama3 */
} shlm_rope_params;

/* Widest head a shlm_rope describes. */
enum { SHLM_ROPE_MAX_HEAD_DIM = 512 };

/* The frequencies of one model: pair i of a head (element i with element i + head_dim/2)
 * turns by pos·freq[i] radians at position pos. Plain data owned by whoever fills it (the
 * model, once, at create); the kernels read it during a call only. The cuda backend keeps
 * its cos/sin table for the contents it was last given (head_dim and freq compared), so a
 * model calling with the same description reuses one table. */
typedef struct shlm_rope {
    int head_dim;                              /* even, 2..SHLM_ROPE_MAX_HEAD_DIM */
    double freq[SHLM_ROPE_MAX_HEAD_DIM / 2];   /* [0, head_dim/2) used, the rest 0 */
} shlm_rope;

/* Fills *r for heads of head_dim with p's type (computed in double):
 *   base_i = theta^(-2i/head_dim)                        (default: freq_i = base_i)
 *   linear: freq_i = base_i / factor
 *   llama3: with wavelen = 2π/base_i, low = original_max_position_embeddings /
 *     low_freq_factor and high = original_max_position_embeddings / high_freq_factor:
 *     wavelen < high: base_i (kept); wavelen > low: base_i / factor; between (both ends
 *     included): (1 - s)·base_i/factor + s·base_i with
 *     s = (original_max_position_embeddings/wavelen - low_freq_factor) /
 *         (high_freq_factor - low_freq_factor).
 * Default's freq_i is pow(theta, -2.0·i/head_dim), the expression the rope kernels
 * evaluated themselves before they took this description (the same doubles, so the same
 * cos/sin). Returns 0, or -1 with one line in err naming the parameter when head_dim is
 * odd or out of range, theta is not a finite positive number, or a parameter the type
 * uses is not (factor > 0; llama3: low_freq_factor > 0, high_freq_factor >
 * low_freq_factor, original_max_position_embeddings > 0). Parameters the type does not
 * use are ignored. */
int shlm_rope_init(shlm_rope *r, int head_dim, const shlm_rope_params *p, char *err,
                   size_t errlen);

/* The parameters shlm_rope_init checks, for shlm_rope_check's callers */
typedef enum shlm_rope_field {
    SHLM_ROPE_F_HEAD_DIM, SHLM_ROPE_F_THETA, SHLM_ROPE_F_TYPE, SHLM_ROPE_F_FACTOR,
    SHLM_ROPE_F_LOW_FREQ_FACTOR, SHLM_ROPE_F_HIGH_FREQ_FACTOR, SHLM_ROPE_F_ORIGINAL_MAX_POS,
    SHLM_ROPE_N_FIELDS
} shlm_rope_field;

/* shlm_rope_init's rules alone (the one copy of them): 0 when it would take (head_dim, p),
 * else -1 with its one-line message in err, the parameters named by names[field] (NULL:
 * config.json's names, "head_dim", "rope_theta", "rope_type", "factor", ...) and the
 * parameter at fault in *bad (when bad is not NULL). */
int shlm_rope_check(int head_dim, const shlm_rope_params *p, const char *const *names,
                    shlm_rope_field *bad, char *err, size_t errlen);

/* "default", "linear", "llama3" */
const char *shlm_rope_type_name(shlm_rope_type t);
/* The type named `name` into *out: 0, or -1 when no type has that name. */
int shlm_rope_type_parse(const char *name, shlm_rope_type *out);
/* The names shlm_rope_type_parse knows, space-separated, for messages. */
const char *shlm_rope_type_names(void);

#endif
