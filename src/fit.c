/* The per-rank sum of fit.h. */
#include "src/fit.h"

#include <string.h>

void fit_bytes_for(const llama_config *m, shlm_dtype act, fsdp_strategy strategy, int S, int R,
                   const fsdp_options *opt, int B, int T, llama_ac ac, const shlm_ops *ops,
                   fit_bytes *o) {
    memset(o, 0, sizeof *o);
    fsdp_plan(m, act, strategy, S, R, opt, &o->pb);
    o->state = o->pb.master + o->pb.grad + o->pb.moments;
    o->buffers = o->pb.gathered + o->pb.grad_buffers;
    o->acts = llama_activation_bytes_for(m, act, B, T, ac);
    if (ops && ops->scratch_bytes)
        o->scratch = ops->scratch_bytes(B, T, m->dim, m->n_heads, m->n_kv_heads, m->head_dim);
    o->total = o->state + o->buffers + o->acts + o->scratch;
}
