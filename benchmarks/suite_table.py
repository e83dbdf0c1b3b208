"""The GPU suite's bookkeeping (benchmarks/gpu_suite.sh): turns what each measurement left
(shardlm's metrics.jsonl, the anchor's JSON line, bench_kernels' table, the comm JSONs,
strong_scaling.sh's CSV, check_gpu.sh's lines) into one JSON object per result appended to
a results file, and prints that file as the tables the suite ends with. Python's standard
library only.

  suite_table.py shardlm METRICS.jsonl --warmup W --out R.jsonl --phase P --pair NAME ...
  suite_table.py anchor ANCHOR.jsonl --out R.jsonl --phase P --pair NAME --system S
  suite_table.py kernels BENCH_KERNELS.txt [--torch CEILINGS.jsonl] --out R.jsonl
  suite_table.py comm BENCH_COMM.json TORCH.json --out R.jsonl
  suite_table.py scaling scaling.csv --out R.jsonl --phase P
  suite_table.py tests CHECK_GPU.txt --out R.jsonl
  suite_table.py print R.jsonl
Training figures: tokens/s per GPU, TFLOP/s per GPU and MFU as src/metrics.c defines them
(6 N + 12 L d T FLOPs per token, 989 TFLOP/s peak); shardlm's are the means over the steps
after the warm-up of its metrics.jsonl, the anchor's its own (benchmarks/anchor/torch_fsdp2.py).
"""
import argparse
import csv
import json
import re
import sys

GIB = 2.0 ** 30


def append(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def train_fields(a):
    return dict(kind="train", phase=a.phase, pair=a.pair, system=a.system, model=a.model,
                seq=a.seq, gpus=a.gpus, strategy=a.strategy, ac=a.ac, mb=a.mb)


def cmd_shardlm(a):
    row = train_fields(a)
    steps = []
    try:
        with open(a.metrics) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        row.update(status="failed", why=f"no metrics ({e.__class__.__name__})")
    timed = [s for s in steps if s.get("step", 0) > a.warmup and s.get("tokens_per_s") is not None]
    if timed:
        n = len(timed)
        mean = lambda k: sum(s[k] for s in timed) / n
        row.update(status="ok", tokens_per_s_per_gpu=mean("tokens_per_s") / a.gpus,
                   tflops_per_gpu=mean("tflops_per_gpu"), mfu=mean("mfu"), step_ms=mean("step_ms"),
                   comm_exposed_ms=mean("comm_exposed_ms"),
                   mem_gib=max(s["mem_peak_bytes"] for s in timed) / GIB, steps_timed=n,
                   first_step=timed[0]["step"])
    elif "status" not in row:
        row.update(status="failed", why=f"no step after the warm-up ({len(steps)} logged)")
    if row["status"] != "ok" and a.log:
        row["why"] = last_error(a.log) or row.get("why")
    append(a.out, row)


def last_error(log):
    try:
        with open(log, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return None
    errs = [l for l in lines if "error" in l.lower() or "out of memory" in l.lower()]
    return (errs or lines or [None])[-1]


def cmd_anchor(a):
    row = train_fields(a)
    last = None
    try:
        with open(a.json) as f:
            for line in f:
                if line.startswith("{"):
                    last = json.loads(line)
    except (OSError, ValueError):
        pass
    if last is None:
        row.update(status="failed", why=(last_error(a.log) if a.log else None) or "no JSON line")
    elif "error" in last:
        row.update(status="out of memory" if "out of memory" in last["error"] else "failed",
                   why=last["error"])
    else:
        row.update(status="ok", tokens_per_s_per_gpu=last["tokens_per_s_per_gpu"],
                   tflops_per_gpu=last["tflops_per_gpu"], mfu=last["mfu"],
                   step_ms=last["step_ms_mean"], mem_gib=last["mem_peak_bytes"] / GIB,
                   steps_timed=last["steps"], first_step=last["warmup"] + 1,
                   optimizer=last.get("optimizer"))
        if last.get("mem_reserved_peak_bytes") is not None:
            row["mem_note"] = (f"alloc {last['mem_allocated_peak_bytes'] / GIB:.1f} / "
                               f"reserved {last['mem_reserved_peak_bytes'] / GIB:.1f}")
    append(a.out, row)


# bench_kernels' rows: op, shape, us, TFLOP/s, GB/s, %ceiling, #wrong ("-" where none); the op
# is the words before the shape, which starts with a digit or a NAME=value
KROW = re.compile(r"^  (\S.*?) +((?:\d|[A-Za-z]+=)\S*.*?) +([0-9.]+) +(\S+) +(\S+) +(\S+) +(\d+)\s*$")


def cmd_kernels(a):
    rows = {}
    wrong = None
    ceiling = None
    with open(a.table, errors="replace") as f:
        for line in f:
            m = KROW.match(line)
            if m:
                op = m.group(1).strip()
                rows[op] = dict(shape=m.group(2).strip(), us=float(m.group(3)),
                                tflops=float(m.group(4)) if m.group(4) != "-" else None,
                                gbs=float(m.group(5)) if m.group(5) != "-" else None,
                                wrong=int(m.group(7)))
            m = re.match(r"# ceilings: bf16 matmul ([0-9.]+) TFLOP/s, device copy ([0-9.]+) GB/s", line)
            if m:
                ceiling = (float(m.group(1)), float(m.group(2)))
            m = re.match(r"# (\d+) wrong", line)
            if m:
                wrong = int(m.group(1))
    if ceiling is None:
        append(a.out, dict(kind="kernel", case="bench_kernels", status="failed",
                           why=last_error(a.table) or "no ceilings line"))
        return
    append(a.out, dict(kind="kernel", case="ceiling: bf16 matmul 8192^3 (shardlm, cuBLASLt)",
                       tflops=ceiling[0], status="ok"))
    append(a.out, dict(kind="kernel", case="ceiling: device copy 1 GiB (shardlm)", gbs=ceiling[1],
                       status="ok"))
    for sfx, label in (("", "causal"), (" docs", "documents of 512")):
        fwd, bwd = rows.get("attention_fwd" + sfx), rows.get("attention_bwd" + sfx)
        if not fwd or not bwd or fwd["tflops"] is None or bwd["tflops"] is None:
            continue
        for name, r in (("fwd", fwd), ("bwd", bwd)):
            append(a.out, dict(kind="kernel", case=f"attention {name}, {label}", shape=r["shape"],
                               us=r["us"], tflops=r["tflops"], pct=100 * r["tflops"] / ceiling[0],
                               wrong=r["wrong"], status="ok"))
        # the two passes' work over their summed time (TFLOP/s x us is work in MFLOP)
        us = fwd["us"] + bwd["us"]
        tf = (fwd["tflops"] * fwd["us"] + bwd["tflops"] * bwd["us"]) / us
        append(a.out, dict(kind="kernel", case=f"attention fwd+bwd, {label}", shape=fwd["shape"],
                           us=us, tflops=tf, pct=100 * tf / ceiling[0],
                           wrong=fwd["wrong"] + bwd["wrong"], status="ok"))
    if a.torch:
        try:
            with open(a.torch) as f:
                trows = [json.loads(l) for l in f if l.startswith("{")]
        except (OSError, ValueError):
            trows = []
        for r in trows:
            if r.get("kind") == "square":
                append(a.out, dict(kind="kernel", case="ceiling: bf16 matmul 8192^3 (torch, cuBLAS)",
                                   tflops=r["tflops"], wrong=r["wrong"], status="ok"))
        copies = [r for r in trows if r.get("kind") == "copy"]
        if copies:
            best = max(copies, key=lambda r: r["gbs"])
            append(a.out, dict(kind="kernel", case=f"ceiling: device {best['case']} (torch)",
                               gbs=best["gbs"], wrong=best["wrong"], status="ok"))
    append(a.out, dict(kind="kernel", case="bench_kernels: every op checked", wrong=wrong,
                       status="ok" if wrong == 0 else "failed"))


def cmd_comm(a):
    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
    mine, theirs = load(a.shardlm), load(a.torch)
    if not mine:
        append(a.out, dict(kind="comm", op="bench_comm", status="failed", why="no JSON"))
        return
    tmap = {}
    for r in (theirs or {}).get("results", []):
        tmap[(r["op"], r["dtype"], r["size_bytes"])] = r
    for r in mine["results"]:
        t = tmap.get((r["op"], r["dtype"], r["size_bytes"]))
        append(a.out, dict(kind="comm", op=r["op"], dtype=r["dtype"], size_bytes=r["size_bytes"],
                           ranks=mine.get("ranks"), busbw=r["in_place"]["busbw_gbs"],
                           wrong=r["in_place"]["wrong"] + r["out_of_place"]["wrong"],
                           torch_busbw=t["busbw_gbs"] if t else None, status="ok"))


def cmd_scaling(a):
    with open(a.csv) as f:
        rows = list(csv.DictReader(f))
    base = {}
    for r in rows:
        s, n = r["strategy"], int(r["world_size"])
        if s not in base or n < base[s][0]:
            base[s] = (n, float(r["step_ms"]))
    for r in rows:
        s, n, t = r["strategy"], int(r["world_size"]), float(r["step_ms"])
        nb, tb = base[s]
        eff = tb / t if r["mode"] == "weak" else tb * nb / (n * t)
        append(a.out, dict(kind="scaling", phase=a.phase, mode=r["mode"], strategy=s, gpus=n,
                           global_batch=int(r["global_batch"]), mb=int(r["micro_batch"]),
                           seq=int(r["seq_len"]), tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"]),
                           step_ms=t, mfu=float(r["mfu"]), efficiency=eff,
                           repeats=int(r["repeats"]), spread_pct=float(r["repeat_spread_pct"]),
                           status="ok"))


def cmd_tests(a):
    n = 0
    with open(a.log, errors="replace") as f:
        for line in f:
            m = re.match(r"check-gpu: (PASS|SKIP|FAIL) (\S+)(.*)", line.strip())
            if m:
                n += 1
                append(a.out, dict(kind="test", name=m.group(2), status=m.group(1),
                                   why=m.group(3).strip(" ()") or None))
    if n == 0:
        append(a.out, dict(kind="test", name="check_gpu.sh", status="FAIL",
                           why=last_error(a.log) or "no result lines"))


def fmt(v, spec, width):
    return f"{v:{width}{spec}}" if isinstance(v, (int, float)) else f"{'-':>{width}}"


def cmd_print(a):
    try:
        with open(a.results) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except OSError:
        rows = []
    bad = 0
    train = [r for r in rows if r["kind"] == "train"]
    if train:
        print("## training steps: tokens/s per GPU; MFU at 989 TFLOP/s; memory: device memory in "
              "use at its peak (GiB); x: shardlm's tokens/s over this row's")
        print(f"#  {'phase':13s} {'model':12s} {'seq':>5s} {'gpus':>4s} {'strategy':13s} {'ac':4s} "
              f"{'mb':>3s} {'system':13s} {'tok/s/GPU':>10s} {'TFLOP/s':>8s} {'MFU%':>6s} "
              f"{'step_ms':>9s} {'mem_GiB':>8s} {'x':>7s}  notes")
        mine = {(r["phase"], r["pair"]): r for r in train if r["system"] == "shardlm" and r["status"] == "ok"}
        for r in train:
            ok = r["status"] == "ok"
            bad += not ok
            ref = mine.get((r["phase"], r["pair"]))
            x = (ref["tokens_per_s_per_gpu"] / r["tokens_per_s_per_gpu"]
                 if ok and ref and r["system"] != "shardlm" else None)
            note = r.get("mem_note") or ""
            if not ok:
                note = f"{r['status'].upper()}: {r.get('why') or ''}"
            print(f"   {r['phase']:13s} {r['model']:12s} {r['seq']:5d} {r['gpus']:4d} {r['strategy']:13s} "
                  f"{r['ac']:4s} {r['mb']:3d} {r['system']:13s} "
                  f"{fmt(r.get('tokens_per_s_per_gpu'), ',.0f', 10)} {fmt(r.get('tflops_per_gpu'), '.1f', 8)} "
                  f"{fmt(100 * r['mfu'] if ok else None, '.1f', 6)} {fmt(r.get('step_ms'), '.1f', 9)} "
                  f"{fmt(r.get('mem_gib'), '.1f', 8)} {fmt(x, '.3f', 7)}  {note}")
    scal = [r for r in rows if r["kind"] == "scaling"]
    if scal:
        print("## scaling (strong: one global batch at every size, T_1 / (N T_N); weak: one "
              "micro-batch per GPU, T_1 / T_N; T = mean step time)")
        print(f"#  {'mode':6s} {'strategy':13s} {'gpus':>4s} {'global':>6s} {'mb':>3s} {'tok/s/GPU':>10s} "
              f"{'step_ms':>9s} {'MFU%':>6s} {'efficiency%':>11s} {'runs':>4s} {'spread%':>7s}")
        for r in scal:
            print(f"   {r['mode']:6s} {r['strategy']:13s} {r['gpus']:4d} {r['global_batch']:6d} {r['mb']:3d} "
                  f"{r['tokens_per_s_per_gpu']:10,.0f} {r['step_ms']:9.1f} {100 * r['mfu']:6.1f} "
                  f"{100 * r['efficiency']:11.1f} {r['repeats']:4d} {r['spread_pct']:7.1f}")
    kern = [r for r in rows if r["kind"] == "kernel"]
    if kern:
        print("## kernels: bench_kernels at Llama-2-7B shapes; % of the bf16 matmul ceiling it measured")
        print(f"#  {'case':48s} {'time(us)':>9s} {'TFLOP/s':>8s} {'GB/s':>6s} {'%ceiling':>8s} {'#wrong':>6s}")
        for r in kern:
            bad += r["status"] != "ok"
            print(f"   {r['case']:48s} {fmt(r.get('us'), '.1f', 9)} {fmt(r.get('tflops'), '.1f', 8)} "
                  f"{fmt(r.get('gbs'), '.0f', 6)} {fmt(r.get('pct'), '.1f', 8)} {fmt(r.get('wrong'), 'd', 6)}"
                  + (f"  FAILED: {r.get('why')}" if r["status"] != "ok" and r.get("why") else ""))
    comm = [r for r in rows if r["kind"] == "comm"]
    if comm:
        print("## collectives: bus bandwidth GB/s (in place), shardlm's NCCL backend beside torch.distributed")
        print(f"#  {'op':15s} {'dtype':5s} {'size(B)':>11s} {'ranks':>5s} {'shardlm':>8s} {'torch':>8s} {'#wrong':>6s}")
        for r in comm:
            bad += r["status"] != "ok" or bool(r.get("wrong"))
            print(f"   {r['op']:15s} {r.get('dtype', '-'):5s} {fmt(r.get('size_bytes'), 'd', 11)} "
                  f"{fmt(r.get('ranks'), 'd', 5)} {fmt(r.get('busbw'), '.1f', 8)} "
                  f"{fmt(r.get('torch_busbw'), '.1f', 8)} {fmt(r.get('wrong'), 'd', 6)}")
    tests = [r for r in rows if r["kind"] == "test"]
    if tests:
        print("## GPU tests (tests/gpu/check_gpu.sh, what make check-gpu runs)")
        for r in tests:
            bad += r["status"] == "FAIL"
            print(f"   {r['status']:4s} {r['name']}" + (f"  ({r['why']})" if r.get("why") else ""))
    return 1 if bad else 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def train_args(p):
        p.add_argument("--out", required=True)
        p.add_argument("--phase", required=True)
        p.add_argument("--pair", required=True)
        p.add_argument("--system", default="shardlm")
        p.add_argument("--model", required=True)
        p.add_argument("--seq", type=int, required=True)
        p.add_argument("--gpus", type=int, required=True)
        p.add_argument("--strategy", required=True)
        p.add_argument("--ac", required=True)
        p.add_argument("--mb", type=int, required=True)
        p.add_argument("--log", default=None)
    p = sub.add_parser("shardlm")
    p.add_argument("metrics")
    p.add_argument("--warmup", type=int, required=True)
    train_args(p)
    p = sub.add_parser("anchor")
    p.add_argument("json")
    train_args(p)
    p = sub.add_parser("kernels")
    p.add_argument("table")
    p.add_argument("--torch", default=None)
    p.add_argument("--out", required=True)
    p = sub.add_parser("comm")
    p.add_argument("shardlm")
    p.add_argument("torch")
    p.add_argument("--out", required=True)
    p = sub.add_parser("scaling")
    p.add_argument("csv")
    p.add_argument("--phase", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("tests")
    p.add_argument("log")
    p.add_argument("--out", required=True)
    p = sub.add_parser("print")
    p.add_argument("results")
    a = ap.parse_args(argv)
    return {"shardlm": cmd_shardlm, "anchor": cmd_anchor, "kernels": cmd_kernels, "comm": cmd_comm,
            "scaling": cmd_scaling, "tests": cmd_tests, "print": cmd_print}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
