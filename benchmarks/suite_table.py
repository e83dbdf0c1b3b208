"""The GPU suite's bookkeeping (benchmarks/gpu_suite.sh): turns what each measurement left
(shardlm's metrics.jsonl, the anchor's JSON line, bench_kernels' table, the comm JSONs,
strong_scaling.sh's CSV, check_gpu.sh's lines) into one JSON object per result appended to
a results file, and prints that file as the tables the suite ends with. Python's standard
library only.

  suite_table.py shardlm METRICS.jsonl --warmup W --out R.jsonl --phase P --pair NAME ...
  suite_table.py anchor ANCHOR.jsonl --out R.jsonl --phase P --pair NAME --system S
  (both: --matmul M names the matmul recipe, default bf16; phase fp8's rows print as a
  table of their own, each against shardlm bf16's row)
  suite_table.py kernels BENCH_KERNELS.txt [--torch CEILINGS.jsonl] --out R.jsonl
  suite_table.py comm BENCH_COMM.json TORCH.json --out R.jsonl
  suite_table.py scaling scaling.csv --out R.jsonl --phase P
  suite_table.py tests CHECK_GPU.txt --out R.jsonl
  suite_table.py print R.jsonl
Training figures: tokens/s per GPU, TFLOP/s per GPU and MFU as src/watch/metrics.c defines them
(6 N + 12 L d T FLOPs per token, 989 TFLOP/s peak); shardlm's are the means over the steps
after the warm-up of its metrics.jsonl, the anchor's its own (benchmarks/anchor/torch_fsdp2.py).
"""
import argparse
import csv
import json
import re
import sys

GIB = 2.0 ** 30
PEAK_BF16 = 989.0  # TFLOP/s: dense bf16 of an H100/H200 SXM, the MFU denominator of every row
FP8_PHASE = "fp8"
FP8_PHASE_NOTES = {"fp8-accum": ", 16 micro-batches accumulated a step"}


def append(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def train_fields(a):
    return dict(kind="train", phase=a.phase, pair=a.pair, system=a.system, matmul=a.matmul,
                model=a.model, seq=a.seq, gpus=a.gpus, strategy=a.strategy, ac=a.ac, mb=a.mb)


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
        # MFU is null where shardlm knows no peak (the cpu backend, a device it lacks)
        mfus = [s["mfu"] for s in timed if s.get("mfu") is not None]
        row.update(status="ok", tokens_per_s_per_gpu=mean("tokens_per_s") / a.gpus,
                   tflops_per_gpu=mean("tflops_per_gpu"),
                   mfu=sum(mfus) / len(mfus) if mfus else None, step_ms=mean("step_ms"),
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
    """v formatted as {v:WIDTH SPEC}; text left-aligned in WIDTH; '-' where there is none"""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:{width}{spec}}"
    if isinstance(v, str) and spec == "s":
        return f"{v:{width}s}"
    return f"{'-':>{width}}"


def table(title, columns, rows):
    """One section: a title line, a '#' header, a row per result. columns: (header, width,
    spec, value of a row); spec 's' is left-aligned text, the rest right-aligned numbers."""
    print(title)
    print("#  " + " ".join(f"{h:{w}s}" if spec == "s" else f"{h:>{w}s}" for h, w, spec, _ in columns))
    for r in rows:
        print("   " + " ".join(fmt(get(r), spec, w) for _, w, spec, get in columns))


def key(name, scale=None):
    """the value of a row's NAME, times SCALE when given and a number"""
    if scale is None:
        return lambda r: r.get(name)
    return lambda r: r.get(name) * scale if isinstance(r.get(name), (int, float)) else r.get(name)


def cmd_print(a):
    try:
        with open(a.results) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except OSError:
        rows = []
    of = lambda kind: [r for r in rows if r["kind"] == kind]
    train, scal, kern, comm, tests = of("train"), of("scaling"), of("kernel"), of("comm"), of("test")
    bad = sum(r["status"] != "ok" for r in train + kern + comm) + sum(bool(r.get("wrong")) for r in comm)
    # the fp8 phases' rows have a table of their own per phase, against its shardlm bf16
    is_fp8 = lambda r: r["phase"] == FP8_PHASE or r["phase"].startswith(FP8_PHASE + "-")
    fp8 = [r for r in train if is_fp8(r)]
    train = [r for r in train if not is_fp8(r)]
    bad += sum(r["status"] == "FAIL" for r in tests)
    mine = {(r["phase"], r["pair"]): r for r in train if r["system"] == "shardlm" and r["status"] == "ok"}

    def ratio(r):
        ref = mine.get((r["phase"], r["pair"]))
        if r["status"] != "ok" or not ref or r["system"] == "shardlm":
            return None
        return ref["tokens_per_s_per_gpu"] / r["tokens_per_s_per_gpu"]

    def note(r):
        return r.get("mem_note") or "" if r["status"] == "ok" else f"{r['status'].upper()}: {r.get('why') or ''}"
    if train:
        table("## training steps: tokens/s per GPU; MFU at 989 TFLOP/s; memory: device memory in use "
              "at its peak (GiB); ratio: shardlm's tokens/s over this row's",
              [("phase", 13, "s", key("phase")), ("model", 12, "s", key("model")), ("seq", 5, "d", key("seq")),
               ("gpus", 4, "d", key("gpus")), ("strategy", 13, "s", key("strategy")), ("ac", 4, "s", key("ac")),
               ("mb", 3, "d", key("mb")), ("system", 13, "s", key("system")),
               ("tok/s/GPU", 10, ",.0f", key("tokens_per_s_per_gpu")), ("TFLOP/s", 8, ".1f", key("tflops_per_gpu")),
               ("MFU%", 6, ".1f", key("mfu", 100)), ("step_ms", 9, ".1f", key("step_ms")),
               ("mem_GiB", 8, ".1f", key("mem_gib")), ("ratio", 7, ".3f", ratio), ("notes", 0, "s", note)],
              train)
    for phase in dict.fromkeys(r["phase"] for r in fp8):
        rows_ = [r for r in fp8 if r["phase"] == phase]
        ref = next((r for r in rows_ if r["system"] == "shardlm" and r.get("matmul", "bf16") == "bf16"
                    and r["status"] == "ok"), None)

        def vs_bf16(key_name):
            def get(r):
                if r["status"] != "ok" or not ref or not isinstance(r.get(key_name), (int, float)):
                    return None
                return r[key_name] / ref[key_name]
            return get
        table(f"## fp8 (phase {phase}{FP8_PHASE_NOTES.get(phase, '')}): tokens/s per GPU; TFLOP/s of the model's FLOPs (6 N + 12 L d T); "
              "MFU% at the bf16 peak 989 TFLOP/s for every row; x_bf16: this row's tokens/s over "
              "shardlm bf16's; mem: device memory in use at its peak (GiB) and over shardlm bf16's",
              [("model", 12, "s", key("model")), ("seq", 5, "d", key("seq")), ("gpus", 4, "d", key("gpus")),
               ("mb", 3, "d", key("mb")), ("system", 13, "s", key("system")),
               ("matmul", 30, "s", lambda r: r.get("matmul", "bf16")),
               ("tok/s/GPU", 10, ",.0f", key("tokens_per_s_per_gpu")), ("TFLOP/s", 8, ".1f", key("tflops_per_gpu")),
               ("MFU%", 6, ".1f", lambda r: 100 * r["tflops_per_gpu"] / PEAK_BF16
                   if isinstance(r.get("tflops_per_gpu"), (int, float)) else None),
               ("step_ms", 9, ".1f", key("step_ms")), ("x_bf16", 6, ".3f", vs_bf16("tokens_per_s_per_gpu")),
               ("mem_GiB", 8, ".1f", key("mem_gib")), ("mem_x", 5, ".2f", vs_bf16("mem_gib")),
               ("notes", 0, "s", note)], rows_)
    if scal:
        table("## scaling (strong: one global batch at every size, T_1 / (N T_N); weak: one micro-batch "
              "per GPU, T_1 / T_N; T = mean step time)",
              [("mode", 6, "s", key("mode")), ("strategy", 13, "s", key("strategy")), ("gpus", 4, "d", key("gpus")),
               ("global", 6, "d", key("global_batch")), ("mb", 3, "d", key("mb")),
               ("tok/s/GPU", 10, ",.0f", key("tokens_per_s_per_gpu")), ("step_ms", 9, ".1f", key("step_ms")),
               ("MFU%", 6, ".1f", key("mfu", 100)), ("efficiency%", 11, ".1f", key("efficiency", 100)),
               ("runs", 4, "d", key("repeats")), ("spread%", 7, ".1f", key("spread_pct"))], scal)
    if kern:
        table("## kernels: bench_kernels at Llama-2-7B shapes; % of the bf16 matmul ceiling it measured",
              [("case", 48, "s", key("case")), ("time(us)", 9, ".1f", key("us")), ("TFLOP/s", 8, ".1f", key("tflops")),
               ("GB/s", 6, ".0f", key("gbs")), ("%ceiling", 8, ".1f", key("pct")), ("#wrong", 6, "d", key("wrong")),
               ("notes", 0, "s", lambda r: "" if r["status"] == "ok" else f"FAILED: {r.get('why') or ''}")], kern)
    if comm:
        table("## collectives: bus bandwidth GB/s (in place), shardlm's comm backend (bench_comm) beside "
              "torch.distributed",
              [("op", 15, "s", key("op")), ("dtype", 5, "s", key("dtype")), ("size(B)", 11, "d", key("size_bytes")),
               ("ranks", 5, "d", key("ranks")), ("shardlm", 8, ".1f", key("busbw")),
               ("torch", 8, ".1f", key("torch_busbw")), ("#wrong", 6, "d", key("wrong"))], comm)
    if tests:
        table("## GPU tests (tests/gpu/check_gpu.sh, what make check-gpu runs)",
              [("result", 6, "s", key("status")), ("test", 20, "s", key("name")), ("notes", 0, "s", key("why"))],
              tests)
    return 1 if bad else 0


# each subcommand's function and arguments; an option without a default is required
OUT = [("--out", {})]
TRAIN = OUT + [("--phase", {}), ("--pair", {}), ("--system", dict(default="shardlm")), ("--model", {}),
               ("--seq", dict(type=int)), ("--gpus", dict(type=int)), ("--strategy", {}), ("--ac", {}),
               ("--mb", dict(type=int)), ("--log", dict(default=None)), ("--matmul", dict(default="bf16"))]
SUBCOMMANDS = {
    "shardlm": (cmd_shardlm, [("metrics", {}), ("--warmup", dict(type=int))] + TRAIN),
    "anchor": (cmd_anchor, [("json", {})] + TRAIN),
    "kernels": (cmd_kernels, [("table", {}), ("--torch", dict(default=None))] + OUT),
    "comm": (cmd_comm, [("shardlm", {}), ("torch", {})] + OUT),
    "scaling": (cmd_scaling, [("csv", {}), ("--phase", {})] + OUT),
    "tests": (cmd_tests, [("log", {})] + OUT),
    "print": (cmd_print, [("results", {})]),
}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (fn, args) in SUBCOMMANDS.items():
        p = sub.add_parser(name)
        p.set_defaults(fn=fn)
        for arg, kw in args:
            required = arg.startswith("--") and "default" not in kw
            p.add_argument(arg, **(dict(required=True) if required else {}), **kw)
    a = ap.parse_args(argv)
    return a.fn(a) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
