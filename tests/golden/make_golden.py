#!/usr/bin/env python3
# Writes tests/golden/tiny_llama_golden.safetensors: a tiny random Llama (HF transformers'
# LlamaForCausalLM), its inputs, logits, loss and every parameter's gradient, in float64.
#
# Regenerate the fixture (from the repository root; needs torch, transformers, safetensors):
#
#     python3 tests/golden/make_golden.py tests/golden/tiny_llama_golden.safetensors
#
# The output is a pure function of SEED and the shapes below: the parameters are drawn
# here with a seeded torch.Generator (not by transformers' own init, which may change
# between versions), stored as float32, and the reference is then computed in float64
# from exactly those float32 values, so the stored logits/loss/gradients are the exact
# function of the stored weights rounded once to float32. See tests/golden/README.md.

import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 20240611
B, T = 2, 11
IGNORE = -100
# (row, position) of the targets set to IGNORE, so the test covers ignored targets,
# including one at the end of a row and one at the start.
IGNORED = [(0, 3), (0, 10), (1, 0)]

CFG = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: two query heads per kv head
    intermediate_size=44,
    vocab_size=67,  # odd on purpose
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
)

# Standard deviations of the random parameters. Larger than HF's initializer_range
# (0.02) so that attention is far from uniform and the logits far from flat, which
# makes the comparison sensitive to mistakes; norm weights are 1 + noise so that a
# model ignoring them (or using the wrong one) fails.
STD_EMBED = 1.0
STD_MATRIX = 0.2
STD_NORM_NOISE = 0.1


def build_model(gen):
    cfg = LlamaConfig(**CFG)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    model.eval()  # no dropout (attention_dropout is 0 anyway)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                v = 1.0 + STD_NORM_NOISE * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            elif name == "model.embed_tokens.weight":
                v = STD_EMBED * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            else:
                v = STD_MATRIX * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(v)
    return cfg, model


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/tiny_llama_golden.safetensors"
    gen = torch.Generator().manual_seed(SEED)
    cfg, model = build_model(gen)
    V = cfg.vocab_size

    # B rows of T+1 tokens: inputs are the first T, targets the last T (next tokens).
    seq = torch.randint(0, V, (B, T + 1), generator=gen, dtype=torch.int64)
    seq[0, 1] = 0       # smallest and largest ids, to catch off-by-one embedding rows
    seq[1, 2] = V - 1
    input_ids = seq[:, :T].clone()
    targets = seq[:, 1:].clone()
    for b, t in IGNORED:
        targets[b, t] = IGNORE

    # fp32 parameters (what the fixture stores) ...
    params32 = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    # ... and the float64 reference computed from exactly those values.
    model = model.to(torch.float64)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=input_ids, use_cache=False).logits  # (B, T, V) float64
    assert logits.dtype == torch.float64 and logits.shape == (B, T, V)
    # Loss exactly as HF does it (mean over non-ignored targets), with explicit
    # targets rather than HF's internal label shift: our targets have a real next
    # token at position T-1, which `labels=` cannot express (HF pads the last
    # position with -100).
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="mean")
    loss.backward()

    # Cross-check against HF's own loss path (LlamaForCausalLM.forward -> ForCausalLMLoss)
    # given the same targets as shift_labels= (which makes it skip its own shift; labels=
    # must still be non-None for forward to compute a loss, and is then unused). That
    # path upcasts logits to float32, so it agrees to fp32 precision only.
    with torch.no_grad():
        hf_loss = model(input_ids=input_ids, labels=targets, shift_labels=targets,
                        use_cache=False).loss
    assert abs(hf_loss.item() - loss.item()) < 1e-5 * max(1.0, abs(loss.item())), \
        (hf_loss.item(), loss.item())

    tensors = {}
    for n, p in sorted(params32.items()):
        tensors[n] = p
    tensors["golden.input_ids"] = input_ids.to(torch.int32).contiguous()
    tensors["golden.targets"] = targets.to(torch.int32).contiguous()
    tensors["golden.logits"] = logits.detach().to(torch.float32).contiguous()
    tensors["golden.loss"] = loss.detach().to(torch.float32).reshape(1).contiguous()
    for n, p in sorted(model.named_parameters()):
        assert p.grad is not None, n
        tensors["golden.grad." + n] = p.grad.detach().to(torch.float32).contiguous()

    meta = {
        "dim": str(cfg.hidden_size),
        "n_layers": str(cfg.num_hidden_layers),
        "n_heads": str(cfg.num_attention_heads),
        "n_kv_heads": str(cfg.num_key_value_heads),
        "head_dim": str(cfg.head_dim),
        "ffn_dim": str(cfg.intermediate_size),
        "vocab_size": str(cfg.vocab_size),
        "max_seq_len": str(cfg.max_position_embeddings),
        "norm_eps": repr(float(cfg.rms_norm_eps)),
        "rope_theta": repr(float(CFG["rope_theta"])),
        "batch": str(B),
        "seq_len": str(T),
        "ignore_index": str(IGNORE),
        "seed": str(SEED),
        "reference_dtype": "float64",
        "attn_implementation": "eager",
        "loss": "F.cross_entropy(logits.view(-1,V), targets.view(-1), ignore_index=-100), mean",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "generator": "tests/golden/make_golden.py",
    }
    save_file(tensors, out, metadata=meta)
    print(f"wrote {out}: {len(tensors)} tensors, loss {loss.item():.9f} "
          f"(HF loss path {hf_loss.item():.9f})")


if __name__ == "__main__":
    main()
