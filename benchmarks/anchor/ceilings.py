"""What one GPU can do at the shapes of a Llama-2-7B step, through PyTorch: bf16 matmul
TFLOP/s (cuBLAS as torch calls it) for every linear layer's forward, input gradient and
weight gradient at 4096 and 8192 tokens plus the square 8192^3, and device-to-device copy
bandwidth. The ceilings PyTorch's training step runs against, beside bench_kernels' own
(cuBLASLt through shardlm's backend).

Usage: python3 benchmarks/anchor/ceilings.py [--device cuda|cpu] [--json FILE]
  --device cpu runs every case at 1/16 of the size on the CPU (checks the script only).
Timing: CUDA events around 10 back-to-back calls after 3 warm-up calls, the median of 7
such batches; inputs N(0, 1) in bf16. FLOP of a matmul: 2 M N K; copy bytes: read + written.
Every result is checked against a float32 matmul of its first rows (relative L2 < 1e-2):
a wrong result is a row's #wrong and exit status 1.
"""
import argparse
import json
import statistics
import sys
import time

import torch

# HF LlamaForCausalLM's linear layers at the 7B shape: (name, in features, out features)
LINEARS = (("q/k/v/o", 4096, 4096), ("gate/up", 4096, 11008), ("down", 11008, 4096),
           ("lm_head", 4096, 32000))


def cases(scale):
    for tokens in (4096, 8192):
        for name, k_in, n_out in LINEARS:
            m, k, n = tokens // scale, k_in // scale, n_out // scale
            yield f"fwd   {name}", "fwd", m, k, n        # y[M,N] = x[M,K] W[N,K]^T
            yield f"dgrad {name}", "dgrad", m, n, k      # dx[M,K] = dy[M,N] W[N,K]
            yield f"wgrad {name}", "wgrad", n, m, k      # dW[N,K] = dy[M,N]^T x[M,K]
    yield "square 8192^3", "square", 8192 // scale, 8192 // scale, 8192 // scale


def timer(dev):
    """fn -> median seconds per call"""
    def cuda_time(fn, inner=10, reps=7, warm=3):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize(dev)
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3 / inner)
        return statistics.median(ts)

    def cpu_time(fn, inner=2, reps=3, warm=1):
        for _ in range(warm):
            fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            ts.append((time.perf_counter() - t0) / inner)
        return statistics.median(ts)
    return cuda_time if dev.type == "cuda" else cpu_time


def operands(kind, m, k, n, dev):
    """(fn, check) for an (M x K) @ (K x N) product laid out as the training step has it"""
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(torch.bfloat16)
    if kind == "fwd":
        x, w = rnd(m, k), rnd(n, k)
        a, b = x, w.t()
    elif kind == "dgrad":
        dy, w = rnd(m, k), rnd(k, n)
        a, b = dy, w
    elif kind == "wgrad":
        dy, x = rnd(k, m), rnd(k, n)   # tokens are the reduction dimension
        a, b = dy.t(), x
    else:
        a, b = rnd(m, k), rnd(k, n)
    fn = lambda: a @ b

    def check():
        rows = min(m, 64)
        got = (a[:rows] @ b).float()
        ref = a[:rows].float() @ b.float()
        return float((got - ref).norm() / ref.norm())
    return fn, check


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--json", default=None, help="append one JSON line per row to FILE")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("ceilings: error: no CUDA device visible (--device cpu checks the script)", file=sys.stderr)
        return 2
    dev = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    scale = 1 if a.device == "cuda" else 16
    name = torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu"
    time_of = timer(dev)
    rows, wrong_total = [], 0
    how = "median of 7 batches of 10 calls" if a.device == "cuda" else "1/16 size, median of 3 x 2 calls"
    print(f"# ceilings: {name}, torch {torch.__version__}, bf16 matmul (fp32 accumulation) and "
          f"device copy; {how}")
    print(f"#  {'case':22s} {'M':>6s} {'K':>6s} {'N':>6s} {'time(us)':>10s} {'TFLOP/s':>9s} "
          f"{'GB/s':>8s} {'#wrong':>7s}")
    for label, kind, m, k, n in cases(scale):
        fn, check = operands(kind, m, k, n, dev)
        err = check()
        wrong = int(not err < 1e-2)
        sec = time_of(fn)
        r = dict(case=label, kind=kind, M=m, K=k, N=n, time_us=sec * 1e6,
                 tflops=2.0 * m * n * k / sec / 1e12, rel_l2=err, wrong=wrong)
        rows.append(r)
        wrong_total += wrong
        print(f"   {label:22s} {m:6d} {k:6d} {n:6d} {r['time_us']:10.1f} {r['tflops']:9.1f} "
              f"{'-':>8s} {wrong:7d}", flush=True)
        del fn, check
    for gib in (1, 4):
        n = (gib << 30) // 2 // (scale * scale)
        src = torch.randn(n, device=dev).to(torch.bfloat16)
        dst = torch.empty_like(src)
        sec = time_of(lambda: dst.copy_(src))
        wrong = int(not torch.equal(dst, src))
        r = dict(case=f"copy {gib} GiB" if scale == 1 else f"copy {gib} GiB/{scale * scale}",
                 kind="copy", bytes=2 * n, time_us=sec * 1e6, gbs=2 * 2 * n / sec / 1e9, wrong=wrong)
        rows.append(r)
        wrong_total += wrong
        print(f"   {r['case']:22s} {'':6s} {'':6s} {'':6s} {r['time_us']:10.1f} {'-':>9s} "
              f"{r['gbs']:8.0f} {wrong:7d}", flush=True)
        del src, dst
    square = [r["tflops"] for r in rows if r["kind"] == "square"][0]
    copy = max(r["gbs"] for r in rows if r["kind"] == "copy")
    print(f"# ceilings: bf16 matmul {square:.1f} TFLOP/s (8192^3), device copy {copy:.0f} GB/s")
    print(f"# {wrong_total} wrong")
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, device_name=name, torch=torch.__version__)) + "\n")
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
