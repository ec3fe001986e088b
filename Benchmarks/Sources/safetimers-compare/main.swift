// The side-by-side comparison: `swift run -c release safetimers-compare`.
// `--quick` runs fewer iterations and smaller scales (for CI smoke runs).
// `--scaling` runs only the single-thread costs and the 1/2/4/8-thread throughput
// rows; `--lateness` only the lateness rows; `--footprint` only the bytes per
// pending DelayedWork; `--idle-detectors` only what 1, 4, 16 and 64 idle stall
// detectors cost against a bare heartbeat.

import Dispatch
import Foundation
import SafeTimers

let quick = CommandLine.arguments.contains("--quick")
let iterations = quick ? 20_000 : 200_000
let footprintCount = quick ? 20_000 : 100_000
/// Wall time of each round of a multi-thread throughput row.
let parallelMilliseconds = quick ? 20 : 200

var rows: [Comparison] = []
@MainActor
func add(_ work: String, _ peer: String, _ safe: Double, _ other: Double, _ unit: String) {
    rows.append(Comparison(work: work, peer: peer, safeTimers: safe, peerValue: other, unit: unit))
    print("  measured: \(work) vs \(peer)")
}

/// A `Watchdog` object per section, against the GCD idiom and against a
/// `DelayedWork` schedule + cancel measured the same way.
@MainActor
func addWatchdogObjectRows() {
    let object = Parallel.watchdogObject(threads: 1, iterations: iterations)
    add(
        "Watchdog object per section", "DispatchSourceTimer per section", object,
        Parallel.dispatchSourceIdiom(threads: 1, iterations: iterations), "ns/op")
    add(
        "Watchdog object per section", "DelayedWork schedule+cancel (SafeTimers)", object,
        Parallel.delayedWork(threads: 1, iterations: iterations), "ns/op")
}

/// Wall nanoseconds per operation over all threads, each thread running for the
/// round's wall time (see `Parallel`), with the default queue and with an
/// explicit `queue:` argument.
@MainActor
func addThroughputRows(threadCounts: [Int]) {
    for threads in threadCounts {
        add(
            "withWatchdog, \(threads) threads, ns/op overall", "DispatchSourceTimer per section",
            Parallel.watchdogOverall(threads: threads, milliseconds: parallelMilliseconds),
            Parallel.dispatchSourceIdiomOverall(threads: threads, milliseconds: parallelMilliseconds), "ns/op")
        add(
            "withWatchdog(queue:), \(threads) threads, ns/op overall", "DispatchSourceTimer per section",
            Parallel.watchdogOnQueueOverall(threads: threads, milliseconds: parallelMilliseconds),
            Parallel.dispatchSourceIdiomOverall(threads: threads, milliseconds: parallelMilliseconds), "ns/op")
        add(
            "DelayedWork arm+cancel, \(threads) threads, ns/op overall", "asyncAfter+DispatchWorkItem",
            Parallel.delayedWorkOverall(threads: threads, milliseconds: parallelMilliseconds),
            Parallel.asyncAfterOverall(threads: threads, milliseconds: parallelMilliseconds), "ns/op")
        add(
            "DelayedWork(on: queue) arm+cancel, \(threads) threads, ns/op overall", "asyncAfter+DispatchWorkItem",
            Parallel.delayedWorkOnQueueOverall(threads: threads, milliseconds: parallelMilliseconds),
            Parallel.asyncAfterOverall(threads: threads, milliseconds: parallelMilliseconds), "ns/op")
    }
}

if CommandLine.arguments.contains("--activities") {
    // Only the StallDetector.withActivity rows.
    let count = iterations * 10
    print("withActivity, literal label: \(format(Activities.withActivity(iterations: count), decimals: 2)) ns/op")
    print("TaskLocal.withValue: \(format(Activities.taskLocal(iterations: count), decimals: 2)) ns/op")
    print(
        "withActivity, nested, inner label changing: \(format(Activities.nestedChanging(iterations: count), decimals: 2)) ns/op"
    )
    print("TaskLocal.withValue, nested: \(format(Activities.taskLocalNested(iterations: count), decimals: 2)) ns/op")
    exit(0)
}

/// The count given to a profiling `flag` (`flag N`), `fallback` when the flag
/// comes alone, nil without the flag. A profiling mode runs one operation in a
/// long loop, for `perf record`; or `N` of them, for instruction counts
/// (`valgrind --tool=callgrind`: the difference of two counts over the
/// difference of their N is the cost of one operation).
func profilingCount(_ flag: String, fallback: Int) -> Int? {
    guard let index = CommandLine.arguments.firstIndex(of: flag) else { return nil }
    let next = CommandLine.arguments.index(after: index)
    return next < CommandLine.arguments.endIndex ? Int(CommandLine.arguments[next]) ?? fallback : fallback
}

/// The profiling modes: a flag, its count when given alone, and the loop.
let profilingModes: [(flag: String, fallback: Int, run: (Int) -> Void)] = [
    ("--profile-arm-cancel", 2_000_000, { print(ArmCancel.delayedWork(pending: 0, iterations: $0), "ns/op") }),
    (
        "--profile-arm-cancel-on-queue", 2_000_000,
        { count in
            let queue = DispatchQueue(label: "profile.arm-cancel")
            for _ in 0..<count { DelayedWork.schedule(after: .seconds(10), on: queue) {}.cancel() }
        }
    ),
    // DelayedWorks armed on a manual scheduler and fired by one advance: the firing path.
    ("--profile-virtual-events", 1_000_000, { print(VirtualTime.manualEvents(count: $0).0, "ms") }),
    ("--profile-watchdog-object", 2_000_000, { print(Parallel.watchdogObject(threads: 1, iterations: $0), "ns/op") }),
    // `withWatchdog` sections, with default arguments or (`--with-queue`) a `queue:`.
    (
        "--profile-guarded-section", 2_000_000,
        { count in
            let queue = CommandLine.arguments.contains("--with-queue") ? DispatchQueue(label: "profile.section") : nil
            for _ in 0..<count { withWatchdog(timeout: .seconds(10), queue: queue, onTimeout: {}) { blackHole(0) } }
        }
    ),
]
for mode in profilingModes {
    guard let count = profilingCount(mode.flag, fallback: mode.fallback) else { continue }
    mode.run(count)
    exit(0)
}

if let flag = CommandLine.arguments.firstIndex(of: "--delayed-work-threads"),
    let threads = Int(CommandLine.arguments[flag + 1])
{
    // One DelayedWork throughput row, 10 times (for finding what makes
    // oversubscribed runs vary); the optional second number is each round's
    // wall time in milliseconds.
    let total =
        CommandLine.arguments.count > flag + 2
        ? Int(CommandLine.arguments[flag + 2]) ?? parallelMilliseconds : parallelMilliseconds
    for _ in 0..<10 {
        print(format(Parallel.delayedWorkOverall(threads: threads, milliseconds: total), decimals: 1))
    }
    exit(0)
}

/// CPU per firing of a handler that must run on an event loop: `executor:`
/// against `queue:` and against NIO's `scheduleTask`, due together and spread.
@MainActor
func addExecutorFiringRows() {
    let count = quick ? 10_000 : 100_000
    for (label, spread) in [("due together", Duration.zero), ("due 5 µs apart", Duration.microseconds(5))] {
        let onLoop = ExecutorFiring.cpuPerFiring(.executor, count: count, spread: spread)
        add(
            "DelayedWork(executor: loop.executor) firing, \(label), CPU", "DelayedWork(on: serial queue)", onLoop,
            ExecutorFiring.cpuPerFiring(.queue, count: count, spread: spread), "ns/op")
        add(
            "DelayedWork(executor: loop.executor) firing, \(label), CPU", "swift-nio scheduleTask", onLoop,
            ExecutorFiring.cpuPerFiring(.nio, count: count, spread: spread), "ns/op")
    }
}

if CommandLine.arguments.contains("--executor") {
    addExecutorFiringRows()
    printTable(rows)
    exit(0)
}

if CommandLine.arguments.contains("--idle-detectors") {
    // N idle stall detectors against the bare heartbeat (process CPU, 10 s each).
    // `--count N` measures N detectors alone (for a profiler attached to the run).
    let counts = CommandLine.arguments.firstIndex(of: "--count").flatMap { index in
        CommandLine.arguments.dropFirst(index + 1).first.flatMap(Int.init).map { [$0] }
    }
    IdleDetectors.addRows(counts: counts ?? (quick ? [1, 16] : [1, 4, 16, 64]), seconds: quick ? 3 : 10)
    printTable(rows)
    exit(0)
}

if CommandLine.arguments.contains("--footprint") {
    // Only the bytes per pending DelayedWork (and kept after cancel).
    _ = Footprint.delayedWork(count: 1_000)  // one-time allocations (thread ids, the first slab chunk)
    let (perItem, kept) = Footprint.delayedWork(count: footprintCount)
    print(
        "DelayedWork: \(format(perItem, decimals: 1)) B per pending item, \(format(kept, decimals: 1)) B kept after cancel"
    )
    exit(0)
}

let latenessOnly = CommandLine.arguments.contains("--lateness")
if latenessOnly {
    // Only the lateness rows, for tuning the scheduler thread.
    var results: [(String, Int, Lateness.Percentiles)] = []
    for count in [1_000, 100_000] {
        results.append(("SafeTimers DelayedWork", count, Lateness.delayedWork(count: count)))
        results.append(("swift-nio scheduleTask", count, Lateness.nio(count: count)))
        results.append(("asyncAfter", count, Lateness.asyncAfter(count: count)))
    }
    printLatenessTable(results)
    var burstResults: [(String, Int, Lateness.Percentiles)] = []
    for _ in 0..<2 {
        burstResults.append(("SafeTimers DelayedWork", 10_000, Lateness.delayedWork(count: 10_000, burst: true)))
        burstResults.append(("swift-nio scheduleTask", 10_000, Lateness.nio(count: 10_000, burst: true)))
        burstResults.append(("asyncAfter", 10_000, Lateness.asyncAfter(count: 10_000, burst: true)))
        burstResults.append(("DispatchSourceTimer", 10_000, Lateness.dispatchSource(count: 10_000, burst: true)))
    }
    print("\nBurst (all due at one instant):")
    printLatenessTable(burstResults)
    exit(0)
}

if CommandLine.arguments.contains("--scaling") {
    // Only the single-thread costs and the throughput rows (issue: the engine
    // scales with cores): a short run for comparing engine changes.
    add(
        "guarded section, 0k pending", "DispatchSourceTimer per section",
        GuardedSection.watchdog(pending: 0, iterations: iterations),
        GuardedSection.dispatchSourceIdiom(pending: 0, iterations: iterations), "ns/op")
    add(
        "arm+cancel, 0k pending", "asyncAfter+DispatchWorkItem",
        ArmCancel.delayedWork(pending: 0, iterations: iterations),
        ArmCancel.asyncAfter(pending: 0, iterations: iterations), "ns/op")
    addWatchdogObjectRows()
    addThroughputRows(threadCounts: [1, 2, 4, 8])
    print("")
    printTable(rows)
    exit(0)
}

print("SafeTimers side-by-side benchmark (\(quick ? "quick" : "full") run)")

// Memory first, while the allocator holds nothing else of ours.
_ = Footprint.delayedWork(count: 1_000)  // one-time allocations (thread ids, the first slab chunk)
let safeMemory = Footprint.delayedWork(count: footprintCount)
let asyncAfterMemory = Footprint.asyncAfter(count: footprintCount)
let sourceMemory = Footprint.dispatchSource(count: footprintCount)
add("bytes per pending timer", "asyncAfter+DispatchWorkItem", safeMemory.0, asyncAfterMemory.0, "B")
add("bytes per pending timer", "DispatchSourceTimer", safeMemory.0, sourceMemory.0, "B")
add("bytes kept after cancel", "asyncAfter+DispatchWorkItem", safeMemory.1, asyncAfterMemory.1, "B")
add("bytes kept after cancel", "DispatchSourceTimer", safeMemory.1, sourceMemory.1, "B")

for pending in quick ? [0, 100_000] : [0, 100_000, 1_000_000] {
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
        PeerArmCancel.foundationTimer(pending: pending, iterations: pending == 0 ? iterations / 10 : 200), "ns/op")
    if pending == 0 {
        add(label, "Task.sleep + Task.cancel", safe, PeerArmCancel.taskSleep(iterations: iterations / 10), "ns/op")
    }
}

do {
    let clock = SystemTimerScheduler.shared.clock
    add(
        "sleeping task, create + cancel", "Task.sleep on ContinuousClock",
        ClockSleeps.timerClock(iterations: iterations / 10), PeerArmCancel.taskSleep(iterations: iterations / 10),
        "ns/op")
    let sleepers = quick ? 10_000 : 100_000
    let safe = ClockSleeps.bytesPerSleepingTask(count: sleepers) { try? await clock.sleep(for: .seconds(3600)) }
    let peer = ClockSleeps.bytesPerSleepingTask(count: sleepers) { try? await Task.sleep(for: .seconds(3600)) }
    add("bytes per sleeping task", "Task.sleep on ContinuousClock", safe.0, peer.0, "B")
    add("bytes kept after the sleep is cancelled", "Task.sleep on ContinuousClock", safe.1, peer.1, "B")
}

for pending in [0, 100_000] {
    add(
        "guarded section, \(pending / 1000)k pending", "DispatchSourceTimer per section",
        GuardedSection.watchdog(pending: pending, iterations: iterations),
        GuardedSection.dispatchSourceIdiom(pending: pending, iterations: iterations), "ns/op")
}
for threads in [1, 2] {
    add(
        "guarded section, \(threads) thread\(threads == 1 ? "" : "s") (per thread)", "DispatchSourceTimer per section",
        Parallel.watchdog(threads: threads, iterations: iterations),
        Parallel.dispatchSourceIdiom(threads: threads, iterations: iterations), "ns/op")
}
addWatchdogObjectRows()

// Throughput as threads are added (issue: the engine scales with cores). Wall
// nanoseconds per operation over all threads; 1000 / value = M ops/s.
addThroughputRows(threadCounts: quick ? [1, 2] : [1, 2, 4, 8])

// What the peers' throughput rows left pending in GCD (cancelled items, due 1 s
// after they were armed) is worked off before anything is timed again.
usleep(1_500_000)
Parallel.settle()

// Firing lateness of timers due 1–2 s out.
var latenessRows: [(String, Int, Lateness.Percentiles)] = []
for count in quick ? [1_000] : [1_000, 100_000] {
    let safe = Lateness.delayedWork(count: count)
    latenessRows.append(("SafeTimers DelayedWork", count, safe))
    let peers: [(String, () -> Lateness.Percentiles)] = [
        ("asyncAfter", { Lateness.asyncAfter(count: count) }),
        ("DispatchSourceTimer", { Lateness.dispatchSource(count: count) }),
        ("Task.sleep", { Lateness.taskSleep(count: count) }),
        ("swift-nio scheduleTask", { Lateness.nio(count: count) }),
    ]
    for (name, run) in peers {
        let result = run()
        latenessRows.append((name, count, result))
        add("lateness p99, \(count / 1000)k timers", name, safe.p99, result.p99, "µs")
    }
}

// A burst: 10k timers due at one instant (where batched delivery matters).
var burstRows: [(String, Int, Lateness.Percentiles)] = []
let burstCount = quick ? 1_000 : 10_000
let safeBurst = Lateness.delayedWork(count: burstCount, burst: true)
burstRows.append(("SafeTimers DelayedWork", burstCount, safeBurst))
for (name, run) in [
    ("asyncAfter", { Lateness.asyncAfter(count: burstCount, burst: true) }),
    ("DispatchSourceTimer", { Lateness.dispatchSource(count: burstCount, burst: true) }),
    ("swift-nio scheduleTask", { Lateness.nio(count: burstCount, burst: true) }),
] as [(String, () -> Lateness.Percentiles)] {
    let result = run()
    burstRows.append((name, burstCount, result))
    add("burst of \(burstCount / 1000)k due at once, last handler", name, safeBurst.max, result.max, "µs")
}

// Labelling work for stall reports: StallDetector.withActivity around a call, on
// one thread (goal: at most 20 ns).
add(
    "StallDetector.withActivity, 1 thread", "TaskLocal.withValue",
    Activities.withActivity(iterations: iterations * 10), Activities.taskLocal(iterations: iterations * 10), "ns/op")
add(
    "withActivity nested, inner label changing", "TaskLocal.withValue nested",
    Activities.nestedChanging(iterations: iterations * 10), Activities.taskLocalNested(iterations: iterations * 10),
    "ns/op")

// Virtual time.
let manualHour = VirtualTime.manualHour()
let embeddedHour = VirtualTime.embeddedHour()
precondition(manualHour.1 == 120 && embeddedHour.1 == 120, "an hour of a 30 s timer must fire 120 times")
add("1 h of a 30 s timer, virtual", "swift-nio EmbeddedEventLoop", manualHour.0, embeddedHour.0, "ms")
let eventCount = quick ? 100_000 : 1_000_000
let manualEvents = VirtualTime.manualEvents(count: eventCount)
let embeddedEvents = VirtualTime.embeddedEvents(count: eventCount)
precondition(manualEvents.1 == eventCount && embeddedEvents.1 == eventCount, "every virtual event must fire")
add("\(eventCount / 1000)k virtual events", "swift-nio EmbeddedEventLoop", manualEvents.0, embeddedEvents.0, "ms")

// Handlers on an event loop.
addExecutorFiringRows()

// What idle pending timers cost: wake-ups while far-future timers wait.
let idleCount = quick ? 100_000 : 1_000_000
let safeIdle = IdleWakeUps.delayedWork(count: idleCount)
add(
    "context switches/s, \(idleCount / 1000)k timers 1 h out", "asyncAfter+DispatchWorkItem", safeIdle.perSecond,
    IdleWakeUps.asyncAfter(count: idleCount), "1/s")
add(
    "context switches/s, \(idleCount / 1000)k timers 1 h out", "swift-nio scheduleTask", safeIdle.perSecond,
    IdleWakeUps.nio(count: idleCount), "1/s")

print("")
printTable(rows)
print("")
print("Firing lateness (µs after the deadline; timers due evenly 1–2 s after arming):")
printLatenessTable(latenessRows)
print("")
print("Burst lateness (µs after the deadline; every timer due at the same instant, 1 s after arming):")
printLatenessTable(burstRows)
print("")
print(
    "SafeTimers scheduler-thread wake-ups/s with \(idleCount / 1000)k timers 1 h out: \(format(safeIdle.engineWakeUps, decimals: 2))"
)
