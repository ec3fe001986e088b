// The side-by-side comparison: `swift run -c release safetimers-compare`.
// `--quick` runs fewer iterations (for CI smoke runs).

import Dispatch
import Foundation

let quick = CommandLine.arguments.contains("--quick")
let iterations = quick ? 20_000 : 200_000
let footprintCount = quick ? 20_000 : 100_000

var rows: [Comparison] = []
@MainActor
func add(_ work: String, _ peer: String, _ safe: Double, _ other: Double, _ unit: String) {
    rows.append(Comparison(work: work, peer: peer, safeTimers: safe, peerValue: other, unit: unit))
    print("  measured: \(work) vs \(peer)")
}

if CommandLine.arguments.contains("--profile-arm-cancel") {
    // A long loop of one operation, for `perf record`.
    print(ArmCancel.delayedWork(pending: 0, iterations: 2_000_000), "ns/op")
    exit(0)
}

print("SafeTimers side-by-side benchmark (\(quick ? "quick" : "full") run)")
for pending in [0, 100_000] {
    let label = "arm+cancel, \(pending / 1000)k pending"
    let safe = ArmCancel.delayedWork(pending: pending, iterations: iterations)
    add(
        label, "asyncAfter+DispatchWorkItem", safe, ArmCancel.asyncAfter(pending: pending, iterations: iterations),
        "ns/op")
    add(label, "DispatchSourceTimer", safe, ArmCancel.dispatchSource(pending: pending, iterations: iterations), "ns/op")
    add(
        label, "swift-nio scheduleTask (on loop)", safe, PeerArmCancel.nio(pending: pending, iterations: iterations),
        "ns/op")
    add(
        label, "Foundation Timer + invalidate", safe,
        PeerArmCancel.foundationTimer(pending: pending, iterations: pending == 0 ? iterations / 10 : 500), "ns/op")
    if pending == 0 {
        add(label, "Task.sleep + Task.cancel", safe, PeerArmCancel.taskSleep(iterations: iterations / 10), "ns/op")
    }
}
if !quick {
    let safe = ArmCancel.delayedWork(pending: 1_000_000, iterations: iterations)
    add(
        "arm+cancel, 1000k pending", "asyncAfter+DispatchWorkItem", safe,
        ArmCancel.asyncAfter(pending: 1_000_000, iterations: iterations), "ns/op")
}
for pending in [0, 100_000] {
    add(
        "guarded section, \(pending / 1000)k pending", "DispatchSourceTimer per section",
        GuardedSection.watchdog(pending: pending, iterations: iterations),
        GuardedSection.dispatchSourceIdiom(pending: pending, iterations: iterations), "ns/op")
}
let safeMemory = Footprint.delayedWork(count: footprintCount)
let asyncAfterMemory = Footprint.asyncAfter(count: footprintCount)
let sourceMemory = Footprint.dispatchSource(count: footprintCount)
add("bytes per pending timer", "asyncAfter+DispatchWorkItem", safeMemory.0, asyncAfterMemory.0, "B")
add("bytes per pending timer", "DispatchSourceTimer", safeMemory.0, sourceMemory.0, "B")
add("bytes kept after cancel", "asyncAfter+DispatchWorkItem", safeMemory.1, asyncAfterMemory.1, "B")
add("bytes kept after cancel", "DispatchSourceTimer", safeMemory.1, sourceMemory.1, "B")

print("")
printTable(rows)
