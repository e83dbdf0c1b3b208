#!/usr/bin/env python3
"""Loads a `shardlm ckpt export` directory with Hugging Face transformers and checks that
LlamaForCausalLM reproduces the logits shardlm computed for the same tokens
(`shardlm generate --dump-logits`): per tensor max|a - b| / max|b| < TOL (default 1e-4,
as tests/golden/README.md; both sides in fp32, only summation order differs).

usage: check_export.py EXPORT_DIR LOGITS.safetensors [TOL]
exit 0 match, 1 mismatch, 77 torch/transformers/safetensors missing (test skipped)
"""
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)


def main(export_dir, logits_path, tol):
    try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
        model = LlamaForCausalLM.from_pretrained(export_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    except TypeError:
        model = LlamaForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    dump = load_file(logits_path)
    ids = dump["input_ids"].long()
    want = dump["logits"].float()
    with torch.no_grad():
        got = model(input_ids=ids).logits.float()
    if got.shape != want.shape:
        print(f"check_export: FAIL: transformers gives logits {tuple(got.shape)}, shardlm "
              f"{tuple(want.shape)}")
        return 1
    rel = ((got - want).abs().max() / want.abs().max()).item()
    ok = rel < tol
    print(f"check_export: {export_dir}: transformers {transformers.__version__} (torch "
          f"{torch.__version__}) logits of {ids.shape[1]} tokens vs shardlm's: max rel diff "
          f"{rel:.3e} ({'ok' if ok else 'FAIL'}, tolerance {tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) == 4 else 1e-4))
