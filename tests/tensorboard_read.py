"""Reads a log.tensorboard directory with tensorboard's own code and checks it against
the run directory's metrics.jsonl and the runs' printed job tables (tests/tensorboard.sh).

  python3 tensorboard_read.py TB_DIR METRICS_JSONL OUT:FIRST...

Each OUT:FIRST is one run, in the order they ran: its stdout (which holds the job table it
printed) and the step it started from (0, or the checkpoint's). Checked:
  - one event file per run, named events.out.tfevents.<10 digits>.<host>.<pid>, sorting
    in the order of the runs; every record passes tensorboard's record reader (length and
    data CRC32C), parses as an Event and is the bytes protobuf itself would write for it;
    a file holds the file version, the job text at FIRST, the restart marker at FIRST+1,
    then scalar events at increasing steps;
  - EventAccumulator(TB_DIR).Reload(): for every step of metrics.jsonl (its latest row:
    a resumed run's rows replace those a stopped run logged after its checkpoint) and every
    field of TAGS that holds a number, the tag has one scalar at that step, equal to the
    JSON value rounded to float32 (TensorBoard's simple_value is a float), with the row's
    time; no scalar for a null, a missing field or a step without a row; no other tag
    (a data.train mixture's data/tokens_seen/<file> against tokens_seen_by_source, whose
    files must be those TB_SOURCES names when it is set);
  - the text summary "job" holds, at each run's FIRST, that run's job table as it printed
    it (a Markdown code block: every line indented 4 spaces), under the text plugin, and
    the text plugin renders it as a code block.
Prints one line per check; exits 1 on any failure.
"""
import datetime
import glob
import json
import os
import re
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.plugins.text import text_plugin
from tensorboard.util import tensor_util

# metrics.jsonl's field for each TensorBoard tag (telemetry: none on the cpu backend)
TAGS = {
    "train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
    "train/tokens_seen": "tokens_seen", "val/loss": "val_loss",
    "perf/tokens_per_s": "tokens_per_s", "perf/tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
    "perf/tflops_per_gpu": "tflops_per_gpu", "perf/mfu": "mfu", "perf/step_ms": "step_ms",
    "perf/comm_exposed_ms": "comm_exposed_ms", "perf/comm_shard_ms": "comm_shard_ms",
    "perf/comm_replica_ms": "comm_replica_ms", "mem/peak_bytes": "mem_peak_bytes",
    "progress/elapsed_s": "elapsed_s", "progress/eta_s": "eta_s",
    "progress/tokens_to_go": "tokens_to_go",
    "straggler/slowest_rank": "slowest_rank", "straggler/slowest_step_ms": "slowest_step_ms",
    "straggler/slowest_comm_ms": "slowest_comm_ms",
    "straggler/slowest_compute_ms": "slowest_compute_ms",
    "straggler/fastest_rank": "fastest_rank", "straggler/fastest_step_ms": "fastest_step_ms",
    "straggler/fastest_comm_ms": "fastest_comm_ms",
    "straggler/fastest_compute_ms": "fastest_compute_ms",
}

failures = 0


def check(ok, what):
    global failures
    print(("ok   - " if ok else "FAIL - ") + what)
    failures += not ok


def records(path):
    """Every record's bytes, through tensorboard's record reader (CRCs checked)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    out = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(reader.record())


def job_table(out_path):
    """The job table a run printed: '# job ...' and the '  key = value' lines after it."""
    lines = open(out_path, encoding="utf-8").read().split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("# job "))
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return lines[start:end]


def row_time(row):
    t = datetime.datetime.strptime(row["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def main():
    tb_dir, metrics = sys.argv[1], sys.argv[2]
    runs = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[3:]]

    # the files and their records
    files = sorted(glob.glob(os.path.join(tb_dir, "*tfevents*")))
    names = [os.path.basename(f) for f in files]
    check(len(files) == len(runs), f"{len(files)} event file(s) for {len(runs)} run(s): {names}")
    check(all(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^/]+\.\d+", n) for n in names),
          "names events.out.tfevents.<time>.<host>.<pid>")
    for path, (_, first) in zip(files, runs):
        name = os.path.basename(path)
        try:
            raw = records(path)
        except errors.DataLossError as e:
            check(False, f"{name}: tensorboard's record reader: {e}")
            continue
        events = [event_pb2.Event.FromString(r) for r in raw]
        check(all(e.SerializeToString() == r for e, r in zip(events, raw)),
              f"{name}: {len(raw)} records, CRCs good, each Event as protobuf writes it")
        kinds = [e.WhichOneof("what") for e in events]
        check(len(events) > 3 and events[0].file_version == "brain.Event:2"
              and kinds[1] == "summary" and events[1].step == first
              and events[1].summary.value[0].tag == "job"
              and kinds[2] == "session_log" and events[2].step == first + 1
              and events[2].session_log.status == event_pb2.SessionLog.START,
              f"{name}: file version, job text at step {first}, restart marker at step {first + 1}")
        steps = [e.step for e in events[3:]]
        check(all(k == "summary" for k in kinds[3:]) and steps == sorted(set(steps))
              and steps[0] > first,
              f"{name}: then scalars at steps {steps[0]}..{steps[-1]}, increasing")

    # the scalars against metrics.jsonl
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    latest = {}
    for line in open(metrics, encoding="utf-8"):
        row = json.loads(line)
        latest[row["step"]] = row  # a later run's row of a step replaces an earlier one's
    tags = acc.Tags()["scalars"]
    # a data.train mixture's files: data/tokens_seen/<file> = tokens_seen_by_source[<file>]
    sources = sorted({n for r in latest.values() for n in r.get("tokens_seen_by_source", {})})
    fields = dict(TAGS, **{f"data/tokens_seen/{n}": ("tokens_seen_by_source", n) for n in sources})
    unknown = sorted(set(tags) - set(fields))
    check(not unknown, f"{len(tags)} scalar tags, each one of metrics.jsonl's fields"
          + (f"; unknown: {unknown}" if unknown else ""))
    if os.environ.get("TB_SOURCES"):
        check(sources == sorted(os.environ["TB_SOURCES"].split()),
              f"metrics.jsonl's tokens_seen_by_source names the files {sources}")

    def field_value(row, field):
        return row.get(field[0], {}).get(field[1]) if isinstance(field, tuple) else row.get(field)

    compared, bad_tags = 0, 0
    for tag, field in fields.items():
        events = {}
        for e in acc.Scalars(tag) if tag in tags else []:
            events.setdefault(e.step, []).append(e)
        want = {s: field_value(r, field) for s, r in latest.items()
                if isinstance(field_value(r, field), (int, float))}
        bad = []
        for step, value in want.items():
            got = events.get(step, [])
            if len(got) != 1:
                bad.append(f"step {step}: {len(got)} scalars")
            elif got[0].value != float(np.float32(value)):
                bad.append(f"step {step}: {got[0].value!r} != float32({value!r})")
            elif not -1e-6 <= got[0].wall_time - row_time(latest[step]) < 0.002:
                bad.append(f"step {step}: wall time {got[0].wall_time} vs {latest[step]['time']}")
        extra = sorted(set(events) - set(want))
        if extra:
            bad.append(f"scalars at steps without a number in metrics.jsonl: {extra}")
        compared += len(want)
        if bad or not want:
            check(False, f"{tag} = {field}: " + ("; ".join(bad[:4]) or "no values at all"))
            bad_tags += 1
    check(bad_tags == 0 and compared > 0,
          f"{compared} scalars equal metrics.jsonl's values (as float32) over steps "
          f"{sorted(latest)} and {len(fields)} tags")

    # the job text
    texts = acc.Tensors("job") if "job" in acc.Tags()["tensors"] else []
    check([t.step for t in texts] == [f for _, f in runs],
          f"text 'job' at steps {[t.step for t in texts]} (want {[f for _, f in runs]})")
    plugin = acc.SummaryMetadata("job").plugin_data.plugin_name if texts else ""
    check(plugin == "text", f"under the text plugin ({plugin!r})")
    for t, (out, first) in zip(texts, runs):
        arr = tensor_util.make_ndarray(t.tensor_proto)
        text = arr.item().decode("utf-8")
        want = "".join("    " + l + "\n" for l in job_table(out))
        check(arr.shape == () and text == want,
              f"step {first}: the job table {os.path.basename(out)} printed "
              f"({len(want.splitlines())} lines)")
        html = text_plugin.text_array_to_html(arr, enable_markdown=True)
        check("<pre><code>" in html and "log.tensorboard" in html,
              f"step {first}: the text plugin renders it as a code block")
    sys.exit(1 if failures else 0)


main()
