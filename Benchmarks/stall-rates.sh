#!/usr/bin/env bash
# The rates of a detector's first stall, as users meet it: a debug and a release
# build, on the machine as it is and beside two processes that keep both cores
# busy. Each run is a fresh process whose detector's first stall is 600 ms busy in
# A, then 300 ms asleep in B.
#
#   bash Benchmarks/stall-rates.sh [runs per condition, default 5]
#       the small helper `stall-probe` (scenario `first-stall`, or `first-stall-main`
#       with `MAIN=1`): samples per second of stall, A : B, and the sampler's CPU
#       over the stall (from `STALLDETECTION_TRACE=1`)
#   bash Benchmarks/stall-rates.sh [runs] --server [threads, default 64] [queue|loop]
#       `stall-server-probe`, a process the size of a server (SwiftNIO linked and
#       running, that many idle threads): samples per second, A : B, whether the
#       stack was there, `.started` after the threshold (ms), the detector's threads'
#       CPU over the stall (% of a core) and start-up CPU (ms); both modes print the
#       longest gap between two samples of the stall (ms)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
server=0
[ "${2:-}" = --server ] && server=1
threads=${3:-64}
target=${4:-queue}

busy_pids=()
stop_busy() { [ ${#busy_pids[@]} -eq 0 ] || kill -9 "${busy_pids[@]}" 2>/dev/null || true; busy_pids=(); }
trap stop_busy EXIT

if [ "$server" = 1 ]; then
    (cd Benchmarks && swift build --product stall-server-probe >/dev/null &&
        swift build -c release --product stall-server-probe >/dev/null)
    debug_helper=Benchmarks/.build/debug/stall-server-probe
    release_helper=Benchmarks/.build/release/stall-server-probe
else
    scenario=first-stall
    [ "${MAIN:-0}" = 1 ] && scenario=first-stall-main
    swift build --product stall-probe >/dev/null
    swift build -c release --product stall-probe --scratch-path .build-release >/dev/null
    debug_helper=.build/debug/stall-probe
    release_helper=.build-release/release/stall-probe
fi

measure() {  # measure <label> <helper>
    for _ in $(seq "$runs"); do
        if [ "$server" = 1 ]; then
            STALLDETECTION_TRACE=1 timeout 60 "$2" --threads "$threads" --target "$target" 2>&1 | awk -v label="$1" '
                /^stalldetection sample/ && $5 == 1 { if (last) { gap = ($7 - last) / 1000; if (gap > maxgap) maxgap = gap }; last = $7 }
                /^RUN / {
                    for (i = 1; i < NF; i++) v[$i] = $(i + 1)
                    printf "%-28s %4d samples  %6.1f /s  A %3d : B %3d  stack %d  started +%s ms  detector %s %% of a core  start-up %s ms  longest gap %.0f ms\n",
                        label, v["samples"], v["samples"] / 0.9, v["A"], v["B"], v["stack"], v["started"], v["detectorCPU"], v["startCPU"], maxgap
                }'
        else
            STALLDETECTION_TRACE=1 timeout 30 "$2" "$scenario" 2>&1 | awk -v label="$1" '
                /^stalldetection sample/ { cpu += $3 - $4; n++ }
                /^stalldetection sample/ && $5 == 1 { if (last) { gap = ($7 - last) / 1000; if (gap > maxgap) maxgap = gap }; last = $7 }
                /^FIRSTSTALL ended/ { samples = $3; a = $4; b = $5 }
                END { printf "%-28s %4d samples  %6.1f /s  A %3d : B %3d  sampler %.2f %% of a core (%d samples traced)  longest gap %.0f ms\n",
                      label, samples, samples / 0.9, a, b, cpu / 1000 / 900 * 100, n, maxgap }'
        fi
    done
}

for build in debug release; do
    helper=$debug_helper
    [ "$build" = release ] && helper=$release_helper
    measure "$build, as the machine is" "$helper"
    for _ in 1 2; do (while :; do :; done) & busy_pids+=($!); done
    measure "$build, 2 busy processes" "$helper"
    stop_busy
done
uptime
