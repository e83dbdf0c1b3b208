"""shardlm's NF4 (kernels/nf4.c, through tests/nf4_dump) against bitsandbytes on the CPU.

For each tensor below, in fp32 and bf16, plain and with double quant:
bitsandbytes.functional.quantize_4bit(x, blocksize=64, quant_type="nf4",
compress_statistics=...) and shardlm must give the same packed codes and absmaxes (double
quant: the same offset, absmax codes and second-level absmaxes), bit for bit, and
dequantize_4bit's values must equal nf4_dequantize's (bf16: after round_to_bf16). The two code
books are compared first.

bitsandbytes' results depend on which of torch's CPU kernels run (kernels/nf4.c): the offset's
mean is summed in an order set by torch's vector width and thread count, and the dynamic map
comes out of torch's arithmetic. This runs torch on one thread with its AVX2 kernels (8 lanes),
which tests/nf4_ref.sh selects through ATEN_CPU_CAPABILITY=avx2.

Usage: nf4_ref.py NF4_DUMP WORKDIR   (exit 0: all equal, 1: a difference, each one printed)
"""
import os
import subprocess
import sys

import numpy as np
import torch
import bitsandbytes.functional as F


def beside_midpoints(code):
    """Blocks whose absmax a has an inexact reciprocal, holding for each midpoint m of the
    levels the floats nearest a·m and a few either side: x·(1/a) (full blocks) and x / a (the
    partial last one) round differently for some of them, and which one is used decides
    their level."""
    mids = ((code[:-1] + code[1:]) / 2).numpy()
    blocks = []
    for a in (3.0, 5.0, 7.0, 11.0, 0.3, 0.7, 1.3, 2.9):
        a = np.float32(a)
        for steps in ((-1, 0, 1), (-3, -2, 2, 3)):
            b = [a]
            for m in mids:
                x = np.float32(a * np.float32(m))
                for k in steps:
                    y = x
                    for _ in range(abs(k)):
                        y = np.nextafter(y, np.float32(np.sign(k) * 10))
                    b.append(y)
            blocks.append(np.pad(np.array(b, np.float32), (0, 64 - len(b))))
    flat = np.concatenate(blocks)
    return torch.from_numpy(np.concatenate([flat, flat[:61]]))  # and a partial last block


def main():
    dump, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "AVX2":
        print(f"nf4_ref: FAIL: torch runs its {cap} kernels, not AVX2 (ATEN_CPU_CAPABILITY=avx2 "
              "and a CPU with AVX2 are needed)")
        return 1
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(f"nf4_ref: {'ok  ' if ok else 'FAIL'} {what}")
        fails += not ok

    def first_diff(a, b):
        a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
        if a.shape != b.shape:
            return f"{a.size} values against {b.size}"
        i = int(np.flatnonzero(a != b)[0])
        return f"{int((a != b).sum())} differ, first at {i}: {a[i]!r} against {b[i]!r}"

    def same(ours, ref, what):
        ours, ref = np.asarray(ours), np.asarray(ref)
        ok = ours.shape == ref.shape and np.array_equal(ours, ref)
        check(ok, what if ok else f"{what}: {first_diff(ours, ref)}")

    def bits32(t):
        return t.detach().float().contiguous().numpy().view(np.uint32).reshape(-1)

    def bits16(t):
        return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1)

    os.makedirs(work, exist_ok=True)
    subprocess.run([dump, "tables", work], check=True)
    levels = np.fromfile(f"{work}/levels.bin", np.uint32)
    dq_levels = np.fromfile(f"{work}/dq_levels.bin", np.uint32)
    same(levels, bits32(F.get_4bit_type("nf4", device="cpu")), "the 16 NF4 levels (get_4bit_type)")
    same(dq_levels, bits32(F.create_dynamic_map()), "the 256 dynamic-map codes (create_dynamic_map)")

    g = torch.Generator().manual_seed(20260601)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    # each case: name, tensor (fp32; bf16 runs use its bf16 rounding), dtypes to run
    cases = []
    cases.append(("normal 4096x64", randn(4096, 64, std=0.02), ("fp32", "bf16")))
    cases.append(("normal 576x576 (a SmolLM2 projection)", randn(576, 576, std=0.05), ("fp32", "bf16")))
    z = randn(64 * 40 + 20)
    z[64 * 5:64 * 10] = 0.0  # whole zero blocks: absmax 0
    z[64 * 40:] = 0.0  # a zero partial last block: absmax clamped to 1e-38
    cases.append(("zero blocks, zero partial tail", z, ("fp32", "bf16")))
    o = randn(64 * 512, std=0.02)
    o[1000], o[7] = 50.0, -30.0
    cases.append(("outliers", o, ("fp32", "bf16")))
    cases.append(("n = 64*300+37 (partial block, odd n)", randn(64 * 300 + 37), ("fp32", "bf16")))
    cases.append(("n = 64*5+1", randn(64 * 5 + 1, std=3.0), ("fp32", "bf16")))
    cases.append(("n = 64*40001 (over torch's 32768-value grain)", randn(64 * 40001, std=0.02),
                  ("fp32",)))
    code = F.get_4bit_type("nf4", device="cpu")
    mids = (code[:-1] + code[1:]) / 2
    t = [torch.tensor([1.0])]
    for m in mids:
        t.append(torch.tensor([m.item(), np.nextafter(np.float32(m.item()), np.float32(2)),
                               np.nextafter(np.float32(m.item()), np.float32(-2))], dtype=torch.float32))
    ties = torch.cat(t)
    ties = torch.cat([ties, torch.zeros(64 - ties.numel()), randn(64 * 3)])
    cases.append(("midpoints of the levels and the floats beside them", ties, ("fp32",)))
    e = randn(64 * 300, std=0.1)
    e[torch.arange(300) * 64 + torch.arange(300) % 64] = torch.where(torch.arange(300) % 2 == 1, 1.0, -1.0)
    cases.append(("every block's absmax 1", e, ("fp32", "bf16")))
    s = randn(64 * 4 + 10)
    s[:64] = randn(64) * 1e-40  # subnormal fp32 values (clamped scale)
    cases.append(("fp32 subnormals", s, ("fp32",)))
    cases.append(("values beside every midpoint, blocks with inexact reciprocals", beside_midpoints(code),
                  ("fp32",)))

    for name, x, dtypes in cases:
        for dt in dtypes:
            xt = x.contiguous() if dt == "fp32" else x.to(torch.bfloat16).contiguous()
            n = xt.numel()
            raw = f"{work}/x.bin"
            (bits32(xt) if dt == "fp32" else bits16(xt)).tofile(raw)
            for dq in (False, True):
                what = f"{name}, {dt}, {'double quant' if dq else 'plain'}"
                out = f"{work}/out"
                os.makedirs(out, exist_ok=True)
                r = subprocess.run([dump, dt, "double" if dq else "plain", raw, str(n), out],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    check(False, f"{what}: nf4_dump failed: {r.stderr.strip()}")
                    continue
                q, st = F.quantize_4bit(xt, blocksize=64, quant_type="nf4", compress_statistics=dq)
                same(np.fromfile(f"{out}/codes.bin", np.uint8), q.numpy().reshape(-1), f"{what}: codes")
                if dq:
                    same(np.fromfile(f"{out}/offset.bin", np.uint32), bits32(st.offset), f"{what}: offset")
                    same(np.fromfile(f"{out}/absmax_codes.bin", np.uint8), st.absmax.numpy().reshape(-1),
                         f"{what}: absmax codes")
                    same(np.fromfile(f"{out}/absmax2.bin", np.uint32), bits32(st.state2.absmax),
                         f"{what}: absmax2")
                else:
                    same(np.fromfile(f"{out}/absmax.bin", np.uint32), bits32(st.absmax), f"{what}: absmax")
                deq = F.dequantize_4bit(q, st, quant_type="nf4")
                ours = np.fromfile(f"{out}/deq.bin", np.uint32 if dt == "fp32" else np.uint16)
                same(ours, bits32(deq) if dt == "fp32" else bits16(deq), f"{what}: dequantized values")
    print(f"nf4_ref: {fails} differences")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
