"""All-gather, reduce-scatter and all-reduce bus bandwidth through torch.distributed (NCCL
on GPUs, gloo on the CPU): what FSDP2's collectives get, beside bench_comm --backend nccl
(shardlm's comm backend). Definitions as nccl-tests and bench_comm: size = the whole
buffer for all-gather and reduce-scatter (gathered / before reduction), one rank's for
all-reduce; algbw = size / time; busbw = algbw x (n-1)/n, or 2(n-1)/n for all-reduce.
Time: the host clock from a barrier to the device synchronisation after --iters
back-to-back operations (after --warmup more), per operation, the slowest rank's. Every result is checked (small integers, exact in bf16): #wrong per row,
exit status 1 on any.

Usage: torchrun --standalone --nproc-per-node=G benchmarks/anchor/nccl_busbw.py \
           [--sizes 1M,4M,16M,64M,256M,1G] [--dtype bf16,fp32] [--iters 20] [--json FILE]
       torchrun --standalone --nproc-per-node=2 benchmarks/anchor/nccl_busbw.py --device cpu --sizes 64K
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
OPS = ("all_gather", "reduce_scatter", "all_reduce")


def size_bytes(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * mult[t[-1]] if t[-1] in mult else int(t)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M,1G")
    ap.add_argument("--dtype", default="bf16,fp32")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--json", default=None, help="write the results as one JSON object to FILE")
    a = ap.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as the suite runs shardlm
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        sync = lambda: torch.cuda.synchronize(dev)
        backend = "nccl " + ".".join(map(str, torch.cuda.nccl.version()))
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        sync = lambda: None
        backend = "gloo"
    rows, wrong_total = [], 0
    if rank == 0:
        print(f"# nccl_busbw: torch {torch.__version__} {backend}, {world} ranks, mean of {a.iters} "
              f"back-to-back operations, slowest rank")
        print(f"#  {'op':15s} {'dtype':5s} {'size(B)':>12s} {'time(us)':>10s} {'algbw(GB/s)':>12s} "
              f"{'busbw(GB/s)':>12s} {'#wrong':>7s}")
    for op in a.ops.split(","):
        if op not in OPS:
            print(f"nccl_busbw: error: unknown op {op} (one of {', '.join(OPS)})", file=sys.stderr)
            return 2
        for dname in a.dtype.split(","):
            dt = DTYPES[dname]
            es = torch.tensor([], dtype=dt).element_size()
            for text in a.sizes.split(","):
                size = size_bytes(text)
                n = size // es
                n -= n % world
                whole = torch.full((n,), float(rank + 1), dtype=dt, device=dev)
                part = torch.full((n // world,), float(rank + 1), dtype=dt, device=dev)
                if op == "all_gather":
                    fn = lambda: dist.all_gather_into_tensor(whole, part)
                    factor = (world - 1) / world
                elif op == "reduce_scatter":
                    fn = lambda: dist.reduce_scatter_tensor(part, whole)
                    factor = (world - 1) / world
                else:
                    fn = lambda: dist.all_reduce(whole)
                    factor = 2 * (world - 1) / world
                # the check: one operation from a known state
                fn()
                sync()
                if op == "all_gather":
                    expect = torch.arange(1, world + 1, dtype=torch.float32,
                                          device=dev).repeat_interleave(n // world)
                    wrong = int((whole.float() != expect).sum())
                elif op == "reduce_scatter":
                    wrong = int((part.float() != world * (world + 1) / 2).sum())
                else:
                    wrong = int((whole.float() != world * (world + 1) / 2).sum())
                for _ in range(a.warmup):
                    fn()
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(a.iters):
                    fn()
                sync()
                sec = torch.tensor([(time.perf_counter() - t0) / a.iters], dtype=torch.float64,
                                   device=dev)
                dist.all_reduce(sec, op=dist.ReduceOp.MAX)
                w = torch.tensor([wrong], dtype=torch.int64, device=dev)
                dist.all_reduce(w)
                t = sec.item()
                nbytes = n * es  # whole buffer (all-gather, reduce-scatter), one rank's (all-reduce)
                r = dict(op=op, dtype=dname, size_bytes=nbytes, time_us=t * 1e6,
                         algbw_gbs=nbytes / t / 1e9, busbw_gbs=nbytes / t / 1e9 * factor,
                         wrong=int(w.item()))
                rows.append(r)
                wrong_total += r["wrong"]
                if rank == 0:
                    print(f"   {op:15s} {dname:5s} {nbytes:12d} {r['time_us']:10.1f} "
                          f"{r['algbw_gbs']:12.2f} {r['busbw_gbs']:12.2f} {r['wrong']:7d}", flush=True)
                del whole, part, fn
    if rank == 0:
        print(f"# {wrong_total} wrong")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(benchmark="nccl_busbw", backend=backend, ranks=world,
                               torch=torch.__version__, iters=a.iters, results=rows), f, indent=1)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
