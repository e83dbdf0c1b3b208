"""RoPE's inverse frequencies as transformers computes them, for tests/rope_freq_ref.sh.

Prints one line per case: TYPE THETA HEAD_DIM FACTOR LOW_FREQ_FACTOR HIGH_FREQ_FACTOR
ORIGINAL_MAX_POSITION_EMBEDDINGS, then the head_dim/2 frequencies (transformers' fp32 values,
printed exactly). llama3 and linear come from ROPE_INIT_FUNCTIONS, default from the
rotary embedding of a LlamaForCausalLM's config (what its attention applies).
"""
import sys

import torch  # noqa: F401  (transformers' functions return torch tensors)
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

# (type, theta, head_dim, factor, low_freq_factor, high_freq_factor, original_max_pos)
CASES = [
    ("llama3", 500000.0, 128, 8.0, 1.0, 4.0, 8192),    # Llama-3.1-8B / 70B
    ("llama3", 500000.0, 64, 32.0, 1.0, 4.0, 8192),    # Llama-3.2-1B
    ("llama3", 500000.0, 128, 32.0, 1.0, 4.0, 8192),   # Llama-3.2-3B
    ("llama3", 10000.0, 16, 4.0, 1.0, 4.0, 256),       # every regime in a few pairs
    ("llama3", 20000.0, 32, 2.5, 1.5, 3.0, 1000),      # fractional factors
    ("llama3", 10000.0, 64, 8.0, 1.0, 4.0, 64),        # a tiny model's context
    ("linear", 10000.0, 64, 2.0, 0, 0, 0),
    ("linear", 500000.0, 128, 4.0, 0, 0, 0),
    ("linear", 1000000.0, 96, 1.5, 0, 0, 0),
    ("default", 10000.0, 64, 0, 0, 0, 0),
    ("default", 1000000.0, 128, 0, 0, 0, 0),           # Qwen2.5
    ("default", 100000.0, 64, 0, 0, 0, 0),             # SmolLM2
]


def frequencies(kind, theta, hd, factor, low, high, orig):
    scaling = None
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": factor}
    elif kind == "llama3":
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                   "high_freq_factor": high, "original_max_position_embeddings": orig}
    config = LlamaConfig(hidden_size=2 * hd, num_attention_heads=2, head_dim=hd,
                         rope_theta=theta, rope_scaling=scaling,
                         max_position_embeddings=max(4 * orig, 4096))
    if kind == "default":
        inv_freq = LlamaRotaryEmbedding(config).inv_freq
    else:
        inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    assert inv_freq.dtype == torch.float32 and inv_freq.numel() == hd // 2
    return [float(x) for x in inv_freq.tolist()]


def main():
    for kind, theta, hd, factor, low, high, orig in CASES:
        freq = frequencies(kind, theta, hd, factor, low, high, orig)
        head = [kind, repr(theta), str(hd), repr(float(factor)), repr(float(low)),
                repr(float(high)), str(orig)]
        sys.stdout.write(" ".join(head + [repr(f) for f in freq]) + "\n")


if __name__ == "__main__":
    main()
