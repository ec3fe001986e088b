import Dispatch
import Foundation
import StallDetection
import Synchronization

// Scenarios that stage stalls as users meet them: a detector's first stall in a
// fresh process, and many detectors (one per queue or event loop) whose targets
// all stall at once. Extra output lines:
//   FIRSTSTALL <phase> <samples> <samples of A> <samples of B> <span ms>
//   DETECTOR <index> <phase> <received ms> <duration ms> <blocker depth in the stack, -1: not named,
//     -2: in the queue's block before its blocker>
//   BLOCKED <index> <begin ms> <end ms>      monotonic times a queue's block began and ended
//   LATE <index> <text>   a late `.started`: how late and why (StallEvent.Lateness)
//   DEPTHS <depth>:<samples> …   the profile's samples by how many queueBlocker frames they show
//     (-1: looks the thread did not answer); ODD <samples> <stack>: a stack without 3 such frames

/// The scenarios this file runs.
let realConditionScenarios: Set<String> = [
    "first-stall", "first-stall-main", "many-queues", "many-loops", "runloop-start-pass", "suspended-queue",
    "short-stalls", "crowded", "recursion-depth",
]

func runRealConditionScenario(_ scenario: String, _ number: Int) {
    switch scenario {
    case "first-stall", "first-stall-main": runFirstStall(onMain: scenario == "first-stall-main")
    case "many-queues", "many-loops": runManyDetectors(count: number, loops: scenario == "many-loops")
    case "runloop-start-pass": runStartInsideRunLoopPass(number)
    case "short-stalls": runShortStalls(number)
    case "suspended-queue": runSuspendedQueue(number)
    case "crowded": runCrowded(threads: number)
    case "recursion-depth": runRecursionDepth(number)
    default:
        print("unknown scenario \(scenario)")
        exit(2)
    }
}

/// A detector's first stall: 600 ms busy in profileStepA, then 300 ms asleep in
/// profileStepB, with nothing before it (no warm-up stall).
func runFirstStall(onMain: Bool) {
    let queue = DispatchQueue(label: "probe.first")
    let detector = StallDetector(target: onMain ? .mainRunLoop : .queue(queue), threshold: .milliseconds(250))
    detector.start()
    Task.detached {
        for await event in detector.events {
            report(event)
            let profile = event.profile
            let share = { (name: String) in
                profile.functions.first { $0.name.contains(name) }?.samples ?? 0
            }
            emit(
                "FIRSTSTALL \(event.phase.rawValue) \(profile.sampleCount) \(share("profileStepA")) "
                    + "\(share("profileStepB")) \(milliseconds(profile.span))")
            if event.phase == .ended { finishAndExit(detector)() }
        }
    }
    let target = onMain ? DispatchQueue.main : queue
    target.asyncAfter(deadline: .now() + 0.3) {
        measuredStall {
            profileStepA(600)
            profileStepB(300)
        }
    }
    if onMain { RunLoop.main.run() } else { dispatchMain() }
}

/// One stall of `ms` in queueBlocker recursed 3 deep: every sample of its
/// profile must show the 3 frames (`DEPTHS`), as a detector per event loop tells
/// its target's blocker from its neighbours' by that depth.
func runRecursionDepth(_ ms: Int) {
    let queue = DispatchQueue(label: "probe.recursion")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    detector.start()
    Task.detached {
        for await event in detector.events where event.phase == .ended {
            let profile = event.profile
            var depths: [Int: Int] = [:]
            for stack in profile.stacks {
                let names = stack.functionIndices.map { profile.functions[$0].name }
                // -1: a look the thread did not answer (no stack to judge).
                let unanswered = names.count == 1 && names[0].hasPrefix("<running, stack unavailable")
                let depth = unanswered ? -1 : names.filter { $0.contains("queueBlocker") }.count
                depths[depth, default: 0] += stack.samples
                if depth != 3 && !unanswered {
                    emit("ODD \(stack.samples) " + names.joined(separator: " ← "))
                }
            }
            emit("DEPTHS " + depths.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: " "))
            finishAndExit(detector)()
        }
    }
    emit("BASE \(String(executableBase() ?? 0, radix: 16))")
    queue.asyncAfter(deadline: .now() + 0.3) { queueBlocker(depth: 3, ms: ms) }
    dispatchMain()
}

/// `count` serial queues (default 8), one detector each (`.queue`, or `.custom`
/// posting to the queue as to an event loop), all blocked at once for 1.5 s, each
/// in queueBlocker recursed index + 1 deep: a report that names another queue's
/// blocker shows another depth.
func runManyDetectors(count: Int, loops: Bool) {
    let count = max(1, min(count, 64))
    let queues = (0..<count).map { DispatchQueue(label: "probe.many.\($0)") }
    let detectors = queues.enumerated().map { index, queue in
        let target: StallDetector.Target =
            loops
            ? .custom(name: "loop \(index)") { probe in queue.async(execute: probe) } : .queue(queue)
        return StallDetector(target: target, threshold: .milliseconds(250))
    }
    // Ends once every detector reported its stall's end (6 s at most).
    let finish: @Sendable () -> Void = {
        guard !manyFinished.exchange(true, ordering: .relaxed) else { return }
        for detector in detectors { detector.stop() }
        emit("CPU \(cpuMilliseconds())")
        exit(0)
    }
    watchMany(detectors) { DispatchQueue.global().asyncAfter(deadline: .now() + 0.1, execute: finish) }
    DispatchQueue.global().asyncAfter(deadline: .now() + 1.0) {
        for (index, queue) in queues.enumerated() {
            queue.async {
                let begin = monotonicMilliseconds()
                queueBlocker(depth: index + 1, ms: 1_500)
                emit("BLOCKED \(index) \(begin) \(monotonicMilliseconds())")
            }
        }
    }
    DispatchQueue.global().asyncAfter(deadline: .now() + 6.0, execute: finish)
    dispatchMain()
}

/// 50 stalls of `number` ms (default 275: the threshold + 10 %), 400 ms apart,
/// each its own block on a serial queue.
func runShortStalls(_ number: Int) {
    let queue = DispatchQueue(label: "probe.short")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 50, then: finishAndExit(detector))
    Thread {
        usleep(300_000)
        for _ in 0..<50 {
            queue.sync { uniquelyNamedQueueBlocker(number) }
            usleep(400_000)
        }
        usleep(1_000_000)
        emit("DONE")
        finishAndExit(detector)()
    }.start()
    dispatchMain()
}

/// The watched queue suspended for `number` ms while other threads work: no
/// thread runs its job, and none may be blamed.
func runSuspendedQueue(_ number: Int) {
    let queue = DispatchQueue(label: "probe.suspended")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    let busy = DispatchQueue(label: "probe.bystander")
    DispatchQueue.global().asyncAfter(deadline: .now() + 0.5) {
        queue.suspend()
        busy.async { uniquelyNamedMainThreadBlocker(number + 500) }
        usleep(UInt32(number) * 1_000)
        queue.resume()
    }
    dispatchMain()
}

/// Which of `runManyDetectors`' detectors (at most 64) reported an `.ended`, a bit each.
private let manyEnded = Atomic<UInt64>(0)
/// Whether `runManyDetectors` is ending (once).
private let manyFinished = Atomic<Bool>(false)

/// Prints a `DETECTOR` line for every event of each detector; calls
/// `allEnded` once each has reported an `.ended`.
private func watchMany(_ detectors: [StallDetector], allEnded: @escaping @Sendable () -> Void) {
    for (index, detector) in detectors.enumerated() {
        detector.start()
        Task.detached(priority: .high) {
            for await event in detector.events {
                let frames = event.backtrace.frames
                let depth = frames.filter { $0.function?.contains("queueBlocker") == true }.count
                // -2: the queue's block just began (the queue had waited for a
                // thread), before its blocker was called.
                let starting = depth == 0 && frames.contains { $0.function?.contains("in runManyDetectors") == true }
                let named = event.backtrace.unavailableReason == nil ? (starting ? -2 : depth) : -1
                emit(
                    "DETECTOR \(index) \(event.phase.rawValue) \(monotonicMilliseconds()) "
                        + "\(milliseconds(event.duration)) \(named) \(milliseconds(event.samplingTime))")
                if let lateness = event.lateness { emit("LATE \(index) \(lateness)") }
                let all = detectors.count == 64 ? UInt64.max : (1 << UInt64(detectors.count)) - 1
                if event.phase == .ended {
                    let (before, after) = manyEnded.bitwiseOr(1 << UInt64(index), ordering: .relaxed)
                    if before != all && after == all { allEnded() }
                }
                if named != index + 1 {
                    let top = event.backtrace.frames.prefix(12).map { $0.function ?? "?" }.joined(separator: " < ")
                    let thread = event.backtrace.threadID.map { "thread \($0): " } ?? ""
                    emit("DETAIL \(index) \(thread)\(event.backtrace.unavailableReason ?? top)")
                }
            }
        }
    }
}

/// Recurses `depth` times, then spins for `ms`: the depth of a report's
/// `queueBlocker` frames tells which queue it sampled.
@inline(never)
func queueBlocker(depth: Int, ms: Int) {
    if depth > 1 {
        queueBlocker(depth: depth - 1, ms: ms)
        blackHole(depth)  // not a tail call: each level keeps its frame
        return
    }
    let end = ContinuousClock.now + .milliseconds(ms)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }
    blackHole(spins)
}

/// A detector of the main run loop started inside a run-loop pass that then
/// blocks for `ms` (an app that starts its detector at launch and then does
/// slow launch work in the same pass).
func runStartInsideRunLoopPass(_ ms: Int) {
    DispatchQueue.main.async {
        let detector = StallDetector(target: .mainRunLoop, threshold: .milliseconds(250))
        watch(detector, endedCount: 1, then: finishAndExit(detector))
        uniquelyNamedMainThreadBlocker(ms)
    }
    DispatchQueue.main.asyncAfter(deadline: .now() + 4) {
        emit("NOEVENT")
        exit(0)
    }
    RunLoop.main.run()
}
