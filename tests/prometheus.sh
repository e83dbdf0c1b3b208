#!/bin/sh
# A real Prometheus (Debian's `prometheus`) scrapes a CPU training run's /metrics
# endpoint (log.prometheus) and Debian's node_exporter reading the run's textfile
# (log.prometheus_textfile); then every sample of the training series that Prometheus
# stored, read back through its HTTP API, must equal the row of the same step in the
# run's metrics.jsonl (loss, learning rate, gradient norm, tokens, step time, validation
# loss), with the host, rank and job labels and the run id. Everything listens on
# 127.0.0.1; every process is bounded in time and stopped by the test.
# Skipped without prometheus, prometheus-node-exporter or python3. By hand:
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/prometheus.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
for b in prometheus prometheus-node-exporter python3; do
    command -v "$b" >/dev/null 2>&1 || skip_test "no $b (Debian: apt-get install prometheus prometheus-node-exporter)"
done
test_begin prometheus.sh shlm_prom
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
    for p in $pids; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT

# three free loopback ports (the kernel's choice, released just before use)
set -- $(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
p_train=$1 p_prom=$2 p_node=$3
mkdir -p "$work/textfile"
prepare_corpus "$work/train.bin"
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$work/prom.ini"
cat >>"$work/prom.ini" <<JOB
[log]
every = 1
run_dir = run
prometheus = 127.0.0.1:$p_train
prometheus_textfile = textfile
JOB
cat >"$work/prometheus.yml" <<CFG
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: shardlm
    honor_labels: true
    static_configs: [{targets: ['127.0.0.1:$p_train']}]
  - job_name: node
    honor_labels: true
    static_configs: [{targets: ['127.0.0.1:$p_node']}]
CFG

timeout 300 prometheus-node-exporter --web.listen-address="127.0.0.1:$p_node" \
    --collector.disable-defaults --collector.textfile \
    --collector.textfile.directory="$work/textfile" >"$work/node_exporter.log" 2>&1 &
pids="$pids $!"
timeout 300 prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$p_prom" >"$work/prometheus.log" 2>&1 &
pids="$pids $!"
api="http://127.0.0.1:$p_prom"
i=0
until python3 -c "import urllib.request; urllib.request.urlopen('$api/-/ready', timeout=1)" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 60 ]; then
        tail -n 5 "$work/prometheus.log"
        fail "Prometheus did not become ready in 30 s"
        exit 1
    fi
    sleep 0.5
done

# a run of ~0.25 s steps (every collective made to last 25 ms) for ~12 scrapes,
# validated every 15 steps
run="sh $SHLM_SRCDIR/tests/mpi_test.sh 2 $SHLM train $work/prom.ini --set train.steps=80 --set train.eval_every=25 --set data.val=train.bin --set train.eval_batches=1 --set runtime.comm_delay_us=25000"
echo "+ (cd $work && $run)"
(cd "$work" && $run) >"$work/run.log" 2>&1 || { tail -n 20 "$work/run.log"; fail "the run failed"; exit 1; }
grep -q "prometheus: .*serving http://127.0.0.1:$p_train/metrics" "$work/run.log" ||
    fail "the run did not say where it serves /metrics"
ls "$work"/textfile/*.prom >/dev/null 2>&1 && fail "the textfile outlived the run"
sleep 2 # Prometheus's last scrape lands

python3 - "$api" "$work/run/metrics.jsonl" "$p_train" "$p_node" "$(hostname)" <<'PY' || fails=$((fails + 1))
import json, sys, urllib.parse, urllib.request
api, jsonl, p_train, p_node, host = sys.argv[1:6]
rows = {}
for line in open(jsonl):
    r = json.loads(line)
    rows[r["step"]] = r
run_id = rows[1]["run_id"]
def query(q):
    url = api + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    out = json.load(urllib.request.urlopen(url, timeout=10))
    assert out["status"] == "success", out
    return out["data"]["result"]
bad = []
names = ["shardlm_step", "shardlm_loss", "shardlm_learning_rate", "shardlm_grad_norm",
         "shardlm_tokens_seen_total", "shardlm_step_seconds", "shardlm_val_loss",
         "shardlm_tokens_per_second"]
series = query('{__name__=~"%s",job="prom"}[10m]' % "|".join(names))
by = {}  # (instance, timestamp) -> {name: value}
for s in series:
    m = s["metric"]
    for k, want in (("host", host), ("rank", "0"), ("job", "prom")):
        if m.get(k) != want:
            bad.append("%s: label %s=%r, want %r" % (m["__name__"], k, m.get(k), want))
    for ts, v in s["values"]:
        by.setdefault((m["instance"], ts), {})[m["__name__"]] = float(v)
def close(a, b, rel, absolute=0):  # metrics.jsonl rounds some fields (README's table)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), absolute)
steps = {}
for (inst, ts), v in sorted(by.items()):
    k = int(v.get("shardlm_step", 0))
    if k == 0:
        continue
    steps.setdefault(inst, set()).add(k)
    r = rows.get(k)
    if r is None:
        bad.append("%s: step %d scraped but not in metrics.jsonl" % (inst, k))
        continue
    checks = [("shardlm_loss", r["loss"], 1e-7, 0), ("shardlm_learning_rate", r["lr"], 1e-6, 0),
              ("shardlm_grad_norm", r["grad_norm"], 1e-7, 0),
              ("shardlm_tokens_seen_total", r["tokens_seen"], 0, 0),
              ("shardlm_step_seconds", r["step_ms"] / 1000, 0, 5.1e-7),
              ("shardlm_tokens_per_second", r["tokens_per_s"], 0, 0.051)]
    val = [rows[j]["val_loss"] for j in sorted(rows) if j <= k and "val_loss" in rows[j]]
    if val:
        checks.append(("shardlm_val_loss", val[-1], 1e-7, 0))
    elif "shardlm_val_loss" in v:
        bad.append("%s step %d: a val loss before any validation" % (inst, k))
    for name, want, rel, absolute in checks:
        got = v.get(name)
        if got is None or not close(got, want, rel, absolute):
            bad.append("%s step %d: %s = %r, metrics.jsonl says %r" % (inst, k, name, got, want))
for inst in ("127.0.0.1:" + p_train, "127.0.0.1:" + p_node):
    n = len(steps.get(inst, ()))
    print("prometheus.sh: %s: %d scraped steps, each equal to its metrics.jsonl row" % (inst, n))
    if n < 3:
        bad.append("%s: only %d distinct steps scraped (want 3 or more)" % (inst, n))
info = query('shardlm_info{job="prom"}[10m]')
ids = {s["metric"].get("run_id") for s in info}
if ids != {run_id}:
    bad.append("shardlm_info run_id labels %r, metrics.jsonl's %r" % (ids, run_id))
up = {s["metric"]["instance"]: s["value"][1] for s in query("up")}
print("prometheus.sh: targets seen:", up)
for b in bad[:20]:
    print("prometheus.sh: FAIL:", b)
sys.exit(1 if bad else 0)
PY
[ $fails -eq 0 ] || { tail -n 5 "$work/prometheus.log"; echo "prometheus.sh: $fails failure(s); kept $work"; exit 1; }
cleanup
trap - EXIT
rm -rf "$work"
echo "prometheus.sh: ok ($(($(date +%s) - t_start)) s)"
