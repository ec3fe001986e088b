#!/usr/bin/env bash
# Throughput and p99 latency of a request guarded by SafeTimers against the same
# request unguarded and under the classic GCD guard, in a real Hummingbird 2 server.
#
#   bash Examples/ServerExample/bench.sh
#
# Builds the server in release, starts it on 127.0.0.1 (a free port), and runs wrk
# against the four /bench routes (each does the same ~26 µs of hashing; each has
# exactly one guard) in interleaved rounds, with two load shapes. Prints a markdown
# table of medians with the spread (min–max) over the rounds, and the server's CPU
# time per request (from /proc: Linux), which depends less on what else runs. Everything it starts
# (the server, each wrk) is stopped by PID when it exits, however it exits.
#
# Environment: ROUNDS (default 6), SECONDS_PER_RUN (5), WORK_BYTES (14336),
# CONNECTIONS_A/THREADS_A (64/2), CONNECTIONS_B/THREADS_B (16/1).
# wrk is installed from the distribution's packages (apt-get) when missing.
set -euo pipefail
cd "$(dirname "$0")"

rounds="${ROUNDS:-6}"
duration="${SECONDS_PER_RUN:-5}"
work_bytes="${WORK_BYTES:-14336}"
threads_a="${THREADS_A:-2}" connections_a="${CONNECTIONS_A:-64}"
threads_b="${THREADS_B:-1}" connections_b="${CONNECTIONS_B:-16}"
routes=(plain watchdog delayed gcd)

if ! command -v wrk >/dev/null 2>&1; then
    echo "bench: wrk is missing; installing it with apt-get (Debian's package)" >&2
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            as_root=(sudo)
        else
            echo "bench: not root and no sudo: install wrk (apt-get install wrk) and run again" >&2
            exit 1
        fi
    fi
    "${as_root[@]}" apt-get install -y -q wrk >/dev/null 2>&1 \
        || { "${as_root[@]}" apt-get update -q >/dev/null && "${as_root[@]}" apt-get install -y -q wrk >/dev/null; }
fi

swift build -c release --build-path .build >&2
binary="$(swift build -c release --build-path .build --show-bin-path)/ServerExample"

work_dir="$(mktemp -d -t server-bench.XXXXXX)"
server_pid=""
wrk_pid=""
cleanup() {
    for pid in "$wrk_pid" "$server_pid"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "$wrk_pid" "$server_pid"; do
        [ -n "$pid" ] || continue
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The watchdog and the GCD guard get 1 s, the request timeout 5 s: none fires.
# Port 0: the kernel picks a free port, and the server logs the one it got.
"$binary" --host 127.0.0.1 --port 0 --work-bytes "$work_bytes" --watchdog-ms 1000 \
    --request-timeout-ms 5000 >"$work_dir/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 1 100); do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work_dir/server.log" >&2; exit 1; }
    port="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$work_dir/server.log" | head -n 1)"
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { echo "bench: the server did not listen within 10 s" >&2; exit 1; }

# The server's CPU time (user + system, all threads) in clock ticks, from /proc:
# per request, it does not depend on how much of the machine the server got.
ticks_per_second="$(getconf CLK_TCK)"
server_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$server_pid/stat"; }

# TCP counters of the whole machine (loopback included), for the evidence of a slow
# round: segments retransmitted, SYNs retransmitted, listen queue overflows and drops.
tcp_counters() {
    python3 - <<'PY'
def table(path):
    lines = open(path).read().splitlines()
    values = {}
    for names, numbers in zip(lines[0::2], lines[1::2]):
        prefix = names.split(":")[0]
        for name, number in zip(names.split()[1:], numbers.split()[1:]):
            values[prefix + name] = int(number)
    return values
values = {**table("/proc/net/snmp"), **table("/proc/net/netstat")}
keys = ["TcpRetransSegs", "TcpExtTCPSynRetrans", "TcpExtListenOverflows", "TcpExtListenDrops"]
print(" ".join(str(values.get(key, 0)) for key in keys))
PY
}
stall_reports() { grep -c "stall #[0-9]* started" "$work_dir/server.log" || true; }

# One wrk run in the background, so that the trap can stop it by PID.
run_wrk() { # threads connections seconds route output
    wrk -t"$1" -c"$2" -d"$3"s --latency "http://127.0.0.1:$port/bench/$4" >"$5" 2>&1 &
    wrk_pid=$!
    wait "$wrk_pid"
    wrk_pid=""
}

echo "bench: warming up" >&2
for route in "${routes[@]}"; do run_wrk "$threads_a" "$connections_a" 2 "$route" /dev/null; done

results="$work_dir/results.tsv"
for round in $(seq 1 "$rounds"); do
    # Interleaved, and the order rotates each round so that no route always runs
    # first (after the idle pause) or last.
    order=("${routes[@]:$(((round - 1) % ${#routes[@]}))}" "${routes[@]:0:$(((round - 1) % ${#routes[@]}))}")
    for route in "${order[@]}"; do
        for shape in a b; do
            if [ "$shape" = a ]; then t=$threads_a c=$connections_a; else t=$threads_b c=$connections_b; fi
            out="$work_dir/wrk-$round-$route-$shape.txt"
            cpu_before="$(server_cpu_ticks)" tcp_before="$(tcp_counters)" stalls_before="$(stall_reports)"
            run_wrk "$t" "$c" "$duration" "$route" "$out"
            cpu_after="$(server_cpu_ticks)" tcp_after="$(tcp_counters)" stalls_after="$(stall_reports)"
            python3 - "$out" "$round" "$route" "$shape" "$((cpu_after - cpu_before))" "$ticks_per_second" \
                "$tcp_before" "$tcp_after" "$((stalls_after - stalls_before))" >>"$results" <<'PY'
import re, sys
path, round_, route, shape, cpu_ticks, ticks_per_second, tcp_before, tcp_after, stalls = sys.argv[1:]
text = open(path).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
m = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
p99 = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
errors = sum(int(n) for n in re.findall(r"(?:Non-2xx or 3xx responses|errors: connect|read|write|timeout)\s*:?\s*(\d+)", text))
requests = int(re.search(r"(\d+) requests in", text).group(1))
cpu_us = int(cpu_ticks) / int(ticks_per_second) * 1e6 / max(1, requests)
m = re.search(r"^\s+Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", text, re.M)
max_ms = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)] if m else 0.0
tcp = " ".join(str(int(a) - int(b)) for a, b in zip(tcp_after.split(), tcp_before.split()))
print(f"{round_}\t{route}\t{shape}\t{rps}\t{p99}\t{errors}\t{cpu_us}\t{max_ms}\t{tcp}\t{stalls}")
PY
            echo "bench: round $round/$rounds $route -t$t -c$c: $(tail -n 1 "$results" | cut -f4,5,7 | tr '\t' ' ')" \
                "(req/s, p99 ms, server CPU µs/request)" >&2
        done
    done
done

# Anything the guards or the stall detectors said while the benchmark ran (with a
# 1 s watchdog and a 100 ms stall threshold, nothing is expected).
reports="$(grep -c -E " (warning|error) " "$work_dir/server.log" || true)"
if [ "$reports" -gt 0 ]; then
    echo "bench: the server logged (first lines):" >&2
    grep -E " (warning|error|notice) " "$work_dir/server.log" | cut -c1-300 | head -n 10 >&2
fi

python3 - "$results" "$reports" "$rounds" "$duration" "$work_bytes" "$threads_a" "$connections_a" "$threads_b" "$connections_b" <<'PY'
import statistics, sys
path, reports, rounds, duration, work, ta, ca, tb, cb = sys.argv[1:]
rows = [line.split("\t") for line in open(path).read().splitlines()]
names = {
    "plain": "plain",
    "watchdog": "`withWatchdog` around the work",
    "delayed": "`DelayedWork` armed and cancelled (request timeout)",
    "gcd": "a `DispatchSourceTimer` per request (the classic guard)",
}
def values(route, shape, column):
    return [float(r[column]) for r in rows if r[1] == route and r[2] == shape]
def fmt(xs, digits):
    med = statistics.median(xs)
    if digits == 0:
        return f"{med:,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"
    if digits == 1:
        return f"{med:.1f} ({min(xs):.1f}–{max(xs):.1f})"
    return f"{med:.2f} ({min(xs):.2f}–{max(xs):.2f})"
errors = sum(int(r[5]) for r in rows)
plain = statistics.median(values("plain", "a", 3))
print(f"{rounds} interleaved rounds of {duration} s per route and load; median (min–max); "
      f"{int(work) // 1024} KiB hashed per request; wrk on loopback; "
      f"wrk errors: {errors}; warnings in the server's log: {reports}")
print()
print(f"| route | req/s (-t{ta} -c{ca}) | vs plain | p99 ms (-t{ta} -c{ca}) | req/s (-t{tb} -c{cb}) | "
      f"p99 ms (-t{tb} -c{cb}) | server CPU µs/request (both loads) |")
print("|---|---|---|---|---|---|---|")
for route, name in names.items():
    a = values(route, "a", 3)
    print(f"| {name} | {fmt(a, 0)} | {100 * (statistics.median(a) / plain - 1):+.1f} % | "
          f"{fmt(values(route, 'a', 4), 2)} | {fmt(values(route, 'b', 3), 0)} | {fmt(values(route, 'b', 4), 2)} | "
          f"{fmt(values(route, 'a', 6) + values(route, 'b', 6), 1)} |")
PY

# The slow rounds, with what the machine saw meanwhile: a round whose p99 is more
# than 5 times its route's median for that load, with its max latency, the TCP
# counters' change (retransmitted segments, retransmitted SYNs, listen queue
# overflows, drops) and the stall reports the server logged during it.
python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
slow = []
for row in rows:
    peers = [float(r[4]) for r in rows if r[1] == row[1] and r[2] == row[2]]
    if float(row[4]) > 5 * statistics.median(peers):
        slow.append(row)
if slow:
    print()
    print("| slow round | route | load | p99 ms | max ms | TCP retransmits / SYN retransmits / listen overflows / drops | stalls reported |")
    print("|---|---|---|---|---|---|---|")
    for r in slow:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {float(r[4]):.1f} | {float(r[7]):.1f} | {' / '.join(r[8].split())} | {r[9]} |")
else:
    print()
    print("No slow round: every round's p99 is within 5 times its route's median for that load.")
PY
