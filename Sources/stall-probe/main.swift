// A child process for StallDetection's integration tests and measurements: each
// scenario sets up a detector, blocks its target in a uniquely named function,
// and prints one line per fact:
//   EVENT <id> <phase> <duration_ms> <base64 of the report>
//   REAL <duration_ms>        how long a block really took
//   READY                     the scenario is running (for tests that signal it)
//   SAMPLING <ms>             how long sampling and symbolicating a stall took
//   CPU <user+system ms>      the detector process' CPU time at the end
//   WAKEUPS <n> <seconds>     context switches of the whole process over the measurement
//   SLEEP <result> <ms>       what a `usleep` in a stalled thread returned, and how long it took
//   BEGIN <ms> / RECEIVED <ms> monotonic time a blocker began / a .started event was received
//   WIDTH <n>, POOLTHREADS <sampled> <naming the blocker>, ROUNDS <n>   cooperative-pool scenarios
//   BASE <hex>                the executable's load address (matrix runs)
//   PROFILE, FUNCTION, ACTIVITIES, STALLCPU, THREADCPU: see ProfileScenarios.swift
//   FRAME <i> <hex address> <inlined 0|1> <uncertain 0|1> <image> <file:line or ->
//                             each frame of a .started event
// Not a product: tests run it from the build folder.

import Dispatch
import Foundation
import StallDetection

// `STALL_PROBE_ARGUMENTS` (space-separated) when the command line is empty: the
// standard library reads it from /proc, which the degraded-environment tests unmount.
let arguments =
    CommandLine.arguments.count <= 1
    ? ArraySlice(
        getenv("STALL_PROBE_ARGUMENTS").map { String(cString: $0).split(separator: " ").map(String.init) } ?? [])
    : CommandLine.arguments.dropFirst()
guard let scenario = arguments.first else {
    print(
        "usage: stall-probe queue|custom|pool [ms [threads]]|pool-global [ms]|pool-busy|runloop|mainqueue-runloop|mainqueue-dispatchmain|busy|idle|recall|overhead|burn [N]"
    )
    print("       stall-probe matrix <case> queue|main|mainqueue [ms]   cases: \(matrixCases.keys.sorted())")
    print("       stall-probe repeat <count> [ms]")
    print("       stall-probe profile-ab|profile-ab-main|backlog|activities|profile-cost [ms]|fatal <path>")
    print("       stall-probe pprof <path>")
    exit(2)
}
let number = arguments.dropFirst().first.flatMap { Int($0) } ?? 600

switch scenario {
case "queue":
    let queue = DispatchQueue(label: "probe.serial")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedQueueBlocker(number) }
    dispatchMain()

case "custom":
    // A private serial queue watched as a custom executor: the detector posts its
    // probe through the closure, as it would to a SwiftNIO event loop.
    let queue = DispatchQueue(label: "probe.custom")
    let detector = StallDetector(
        target: .custom(name: "custom executor") { probe in queue.async(execute: probe) },
        threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedQueueBlocker(number) }
    dispatchMain()

case "pool":
    // Every thread of the cooperative pool (medium priority: as many as cores)
    // blocked for `number` ms. Events are read by a high-priority task, which runs
    // on another pool on Linux, so that they are printed while the stall lasts.
    let detector = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, priority: .high, then: finishAndExit(detector))
    let width = ProcessInfo.processInfo.activeProcessorCount
    emit("WIDTH \(width)")
    // A third argument blocks that many threads instead (fewer than the width: no
    // stall, the probe runs on a free thread); the helper then ends after 2 s.
    let blocked = arguments.dropFirst(2).first.flatMap { Int($0) } ?? width
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
        for _ in 0..<blocked { Task.detached(priority: .medium) { uniquelyNamedPoolBlocker(number) } }
    }
    if blocked < width { DispatchQueue.main.asyncAfter(deadline: .now() + 2, execute: finishAndExit(detector)) }
    dispatchMain()

case "pool-global":
    // Linux: every thread of the default-QoS global queue, which Swift's pool
    // shares there, blocked for `number` ms by dispatch blocks, not tasks (a
    // synchronous driver called from `DispatchQueue.global()`): new tasks wait.
    let detector = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, priority: .high, then: finishAndExit(detector))
    let width = ProcessInfo.processInfo.activeProcessorCount
    emit("WIDTH \(width)")
    // Bystanders, on threads that are not that pool's, busy for the whole stall:
    // a high-priority task, a serial queue's block, a user-initiated global block.
    let bystanding = number + 600
    Task.detached(priority: .high) { uniquelyNamedBystander(bystanding) }
    DispatchQueue(label: "probe.bystander").async { uniquelyNamedBystander(bystanding) }
    DispatchQueue.global(qos: .userInitiated).async { uniquelyNamedBystander(bystanding) }
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
        for _ in 0..<width { DispatchQueue.global().async { uniquelyNamedGlobalQueueBlocker(number) } }
    }
    dispatchMain()

case "pool-busy":
    // The pool busy with many short tasks (2 ms each, in rounds of 50) for
    // `number` seconds, awaited from the main thread (not a pool thread).
    let detector = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
    detector.start()
    Task.detached(priority: .high) { for await event in detector.events { report(event) } }
    let end = ContinuousClock.now + .seconds(number)
    var rounds = 0
    while ContinuousClock.now < end {
        let group = DispatchGroup()
        for _ in 0..<50 {
            group.enter()
            Task.detached(priority: .medium) {
                usleep(2_000)
                group.leave()
            }
        }
        group.wait()
        rounds += 1
    }
    emit("ROUNDS \(rounds)")
    finishAndExit(detector)()

case "runloop", "mainqueue-runloop":
    let detector = StallDetector(
        target: scenario == "runloop" ? .mainRunLoop : .mainQueue, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedMainThreadBlocker(number) }
    RunLoop.main.run()

case "mainqueue-dispatchmain":
    let detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedMainThreadBlocker(number) }
    dispatchMain()

case "busy":
    // Many short blocks for `number` seconds: busy, never blocked.
    let queue = DispatchQueue(label: "probe.busy")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    detector.start()
    Task.detached { for await event in detector.events { report(event) } }
    let end = ContinuousClock.now + .seconds(number)
    while ContinuousClock.now < end {
        for _ in 0..<50 { queue.async { usleep(2_000) } }
        queue.sync {}
    }
    finishAndExit(detector)()

case "matrix":
    // One case of the matrix: on a serial queue (heartbeat), or on the main thread
    // under RunLoop.main (run-loop observer, or main-queue heartbeat).
    let fields = Array(arguments.dropFirst())
    guard fields.count >= 2, matrixCases[fields[0]] != nil else {
        print("usage: stall-probe matrix <case> queue|main|mainqueue [ms]")
        exit(2)
    }
    let name = fields[0]
    let ms = fields.count > 2 ? Int(fields[2]) ?? 700 : 700
    emit("BASE \(String(executableBase() ?? 0, radix: 16))")
    switch fields[1] {
    case "queue":
        let queue = DispatchQueue(label: "probe.matrix")
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
        watch(detector, endedCount: 1, then: finishAndExit(detector))
        queue.asyncAfter(deadline: .now() + 0.3) { runMatrixCase(name, ms) }
        dispatchMain()
    default:
        let detector = StallDetector(
            target: fields[1] == "main" ? .mainRunLoop : .mainQueue, threshold: .milliseconds(250))
        watch(detector, endedCount: 1, then: finishAndExit(detector))
        DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) { runMatrixCase(name, ms) }
        RunLoop.main.run()
    }

case "repeat":
    // `number` stalls of the same case (a sleep of 400 ms) on one queue: the first
    // pays for symbolication, the others hit the cache (SAMPLING lines).
    let queue = DispatchQueue(label: "probe.repeat")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    let count = number == 600 ? 5 : number
    watch(detector, endedCount: count, then: finishAndExit(detector))
    Thread {
        usleep(500_000)
        for _ in 0..<count {
            queue.sync { runMatrixCase("sleep", 400) }
            usleep(300_000)
        }
    }.start()
    dispatchMain()

case "sigprof-default":
    // Other code resets SIGPROF to the default action after the detector started;
    // a stall in running code must not kill the process with the sample's signal.
    let queue = DispatchQueue(label: "probe.sigprof")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) {
        signal(SIGPROF, SIG_DFL)
        matrixBusy1(number)
    }
    dispatchMain()

case "burn":
    // Keeps one core busy for `number` seconds (load for the stop tests).
    let end = ContinuousClock.now + .seconds(number)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }
    blackHole(spins)
    exit(0)

case "idle", "overhead", "overhead-custom", "overhead-pool":
    // A detector on an idle queue for `number` seconds (tests stop and continue
    // this process meanwhile; the overhead measurement reads the CPU line). The
    // same queue behind `.custom`, or the idle cooperative pool, for the others.
    let queue = DispatchQueue(label: "probe.idle")
    // The default heartbeat unless a third argument sets one (milliseconds).
    let heartbeat = arguments.dropFirst(2).first.flatMap { Int($0) }.map { Duration.milliseconds($0) }
    let target: StallDetector.Target =
        switch scenario {
        case "overhead-custom": .custom(name: "idle custom") { probe in queue.async(execute: probe) }
        case "overhead-pool": .cooperativePool
        default: .queue(queue)
        }
    let detector = StallDetector(target: target, threshold: .milliseconds(250), heartbeat: heartbeat)
    detector.start()
    Task.detached { for await event in detector.events { report(event) } }
    emit("READY")
    emit("HEARTBEAT \(milliseconds(detector.heartbeat))")
    // The detector's one-time warm-up (symbol tables loaded, and freed again when the
    // dispatch worker that loaded them retires, about 5 s later) is not overhead.
    if scenario.hasPrefix("overhead") { usleep(8_000_000) }
    let (cpu, switches) = idleCost(seconds: number)
    detector.stop()
    emit("CPU \(cpu)")
    emit("WAKEUPS \(switches) \(number)")
    exit(0)

case "overhead-reference":
    // What a heartbeat costs on this machine with none of a detector's work: a
    // thread that wakes every 25 ms (absolute deadlines) and posts an empty block
    // to a serial queue, the same two wake-ups per heartbeat. The idle cost test
    // bounds the detector's cost by this one's, measured in the same run.
    let queue = DispatchQueue(label: "probe.reference")
    Thread {
        var next = timespec()
        clock_gettime(CLOCK_MONOTONIC, &next)
        while true {
            next.tv_nsec += 25_000_000
            if next.tv_nsec >= 1_000_000_000 {
                next.tv_nsec -= 1_000_000_000
                next.tv_sec += 1
            }
            sleepUntilMonotonic(next)
            queue.async { blackHole(0) }
        }
    }.start()
    emit("HEARTBEAT 25.0")
    usleep(1_000_000)
    let (cpu, switches) = idleCost(seconds: number)
    emit("CPU \(cpu)")
    emit("WAKEUPS \(switches) \(number)")
    exit(0)

case "recall":
    // 20 stalls of random length between 300 ms and 1.5 s, one second apart.
    let queue = DispatchQueue(label: "probe.recall")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 20, then: finishAndExit(detector))
    var generator = SystemRandomNumberGenerator()
    let lengths = (0..<20).map { _ in Int.random(in: 300...1500, using: &generator) }
    // Each stall is its own block, with the queue free in between.
    Thread {
        usleep(300_000)
        for length in lengths {
            queue.sync { uniquelyNamedQueueBlocker(length) }
            usleep(400_000)
        }
    }.start()
    dispatchMain()

case _ where profileScenarios.contains(scenario):
    runProfileScenario(scenario, number)

case _ where samplerEdgeCaseScenarios.contains(scenario):
    runSamplerEdgeCaseScenario(scenario, number)

case _ where unwindEdgeCaseScenarios.contains(scenario):
    runUnwindEdgeCaseScenario(scenario, number)

case _ where realConditionScenarios.contains(scenario):
    runRealConditionScenario(scenario, number)

case "async-alternate":
    runAsyncAlternation(sharedLeaf: arguments.dropFirst().first == "shared")

case "starved-loop":
    runStarvedLoop(rounds: arguments.dropFirst().first.flatMap { Int($0) } ?? 3)

case "async-many":
    runAsyncMany(count: arguments.dropFirst().first.flatMap { Int($0) } ?? 8)

case "async-chain":
    let target = arguments.dropFirst().first ?? "queue"
    runAsyncChain(target: target, depth: arguments.dropFirst(2).first.flatMap { Int($0) } ?? 1)

case "stop-at-stall-end":
    runStopAtStallEnd(seconds: number, lanes: arguments.dropFirst(2).first.flatMap { Int($0) } ?? 4)

case _ where degradedScenarios.contains(scenario):
    runDegradedScenario(scenario, number)

default:
    print("unknown scenario \(scenario)")
    exit(2)
}
