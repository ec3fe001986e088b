#!/usr/bin/env bash
# The rates of a detector's first stall, as users meet it: a debug and a release
# build of `stall-probe`, on the machine as it is and beside two processes that
# keep both cores busy. Each run is a fresh process whose detector's first stall
# is 600 ms busy in A, then 300 ms asleep in B (scenario `first-stall`, or
# `first-stall-main` with `MAIN=1`); it prints samples per second of stall, A : B,
# and the sampler's CPU over the stall (from `STALLDETECTION_TRACE=1`).
#
#   bash Benchmarks/stall-rates.sh [runs per condition, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
scenario=first-stall
[ "${MAIN:-0}" = 1 ] && scenario=first-stall-main
swift build --product stall-probe >/dev/null
swift build -c release --product stall-probe --scratch-path .build-release >/dev/null

measure() {  # measure <label> <helper>
    for _ in $(seq "$runs"); do
        STALLDETECTION_TRACE=1 timeout 30 "$2" "$scenario" 2>&1 | awk -v label="$1" '
            /^stalldetection sample/ { cpu += $3 - $4; n++ }
            /^FIRSTSTALL ended/ { samples = $3; a = $4; b = $5 }
            END { printf "%-28s %4d samples  %6.1f /s  A %3d : B %3d  sampler %.2f %% of a core (%d samples traced)\n",
                  label, samples, samples / 0.9, a, b, cpu / 1000 / 900 * 100, n }'
    done
}

busy_pids=()
stop_busy() { [ ${#busy_pids[@]} -eq 0 ] || kill -9 "${busy_pids[@]}" 2>/dev/null || true; busy_pids=(); }
trap stop_busy EXIT
for build in debug release; do
    helper=.build/debug/stall-probe
    [ "$build" = release ] && helper=.build-release/release/stall-probe
    measure "$build, as the machine is" "$helper"
    for _ in 1 2; do (while :; do :; done) & busy_pids+=($!); done
    measure "$build, 2 busy processes" "$helper"
    stop_busy
done
uptime
