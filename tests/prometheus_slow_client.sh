#!/bin/sh
# A run whose /metrics endpoint (log.prometheus) has a slow client connected from start
# to end — one that sends its request a byte every 0.5 s and connects again whenever the
# exporter drops it — still answers a scrape meanwhile and exits within 5 s of its
# closing summary line: the exporter never waits for a client.
# Everything is on 127.0.0.1; the client gives up after 40 s, the run is killed after 60.
# Skipped without python3. By hand:
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/prometheus_slow_client.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
command -v python3 >/dev/null 2>&1 || skip_test "no python3"
test_begin prometheus_slow_client.sh shlm_prom_slow
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
}
trap cleanup EXIT
prepare_corpus "$work/train.bin"
port=$(python3 -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')

# the slow client: drips until told to stop (the file $work/stop) or 40 s
python3 - "$port" "$work/stop" >"$work/client.log" 2>&1 <<'PY' &
import os, socket, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
t_end = time.time() + 40
head = b"GET /metrics HTTP/1.1\r\nX-Slow: "
while time.time() < t_end and not os.path.exists(stop):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        time.sleep(0.05)  # not listening yet, or gone
        continue
    print("connected %.3f" % time.time(), flush=True)
    i = 0
    try:
        while time.time() < t_end and not os.path.exists(stop):
            s.send(head[i:i + 1] if i < len(head) else b"a")
            i += 1
            s.settimeout(0.5)
            try:
                if s.recv(256) == b"":
                    break  # dropped by the server
            except socket.timeout:
                pass
    except OSError:
        pass
    print("dropped %.3f after %d bytes" % (time.time(), i), flush=True)
    s.close()
PY
pids="$pids $!"

set -- "$SHLM" train "$SHLM_SRCDIR/tests/jobs/ckpt.ini" --set "data.train=$work/train.bin" \
    --set "log.run_dir=$work/run" --set "checkpoint.dir=$work/ckpt" --set train.steps=250 \
    --set train.eval_every=0 --set "log.prometheus=127.0.0.1:$port"
echo "+ $*"
timeout 60 "$@" >"$work/run.log" 2>&1 </dev/null &
run=$!
pids="$pids $run"

# a scrape while the slow client is connected
i=0
until grep -q "^connected" "$work/client.log" 2>/dev/null || [ $i -ge 300 ]; do
    sleep 0.05
    i=$((i + 1))
done
grep -q "^connected" "$work/client.log" || fail "the slow client never connected"
python3 - "$port" <<'PY' || fail "no scrape answered within 2 s while the slow client was connected"
import sys, time, urllib.request
t0 = time.time()
try:
    body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=2).read()
except OSError as e:
    sys.exit("prometheus_slow_client.sh: the scrape: %s" % e)
if b"shardlm_steps{" not in body:
    sys.exit("prometheus_slow_client.sh: no shardlm_steps in %r" % body[:200])
print("prometheus_slow_client.sh: a scrape answered in %.0f ms with a slow client connected"
      % (1e3 * (time.time() - t0)))
PY

# the time from the summary line to the exit
i=0
until grep -q "^summary: run" "$work/run.log" 2>/dev/null || ! kill -0 $run 2>/dev/null || [ $i -ge 1200 ]; do
    sleep 0.05
    i=$((i + 1))
done
t_summary=$(date +%s.%N)
wait $run
rc=$?
t_exit=$(date +%s.%N)
touch "$work/stop"
pids=""
wait
grep -q "^summary: run" "$work/run.log" || { tail -n 20 "$work/run.log"; fail "the run printed no summary (exit $rc)"; }
[ $rc -eq 0 ] || { tail -n 20 "$work/run.log"; fail "the run exited $rc"; }
took=$(echo "$t_summary $t_exit" | awk '{ printf "%.1f", $2 - $1 }')
echo "prometheus_slow_client.sh: exit $rc, $took s after the summary line; the client: $(grep -c '^connected' "$work/client.log") connection(s)"
awk -v t="$took" 'BEGIN { exit !(t < 5) }' || fail "the run took $took s after its summary line to exit (want < 5): the exporter waited for the slow client"
grep "^dropped" "$work/client.log" | head -n 3
test_end
