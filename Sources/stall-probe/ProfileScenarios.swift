import Dispatch
import Foundation
import StallDetection

// Scenarios for profiles, activities and fatal reports. Extra output lines:
//   PROFILE <id> <phase> <sampleCount> <interval ms> <span ms>
//   FUNCTION <id> <phase> <samples> <name>      each function of the profile, most samples first
//   ACTIVITIES <id> <phase> <labels joined by " › ">
//   STALLCPU <ms of CPU of every other thread> <wall ms>   over a stalled block
//   THREADCPU <ms>                                           the blocked thread's own CPU over it
//   POSTED <ms>, GATE <ms>, REAL <ms>   backlog: posting the items, the queue's wait at their gate, items run

/// The scenarios this file runs.
let profileScenarios: Set<String> = [
    "profile-ab", "profile-ab-main", "backlog", "fatal", "profile-cost", "activities", "pprof",
]

func reportProfile(_ event: StallEvent) {
    let profile = event.profile
    emit(
        "PROFILE \(event.id) \(event.phase.rawValue) \(profile.sampleCount) \(milliseconds(profile.interval)) "
            + "\(milliseconds(profile.span))")
    for function in profile.functions {
        emit("FUNCTION \(event.id) \(event.phase.rawValue) \(function.samples) \(function.name)")
    }
    if !event.activities.isEmpty {
        emit("ACTIVITIES \(event.id) \(event.phase.rawValue) \(event.activities.joined(separator: " › "))")
    }
}

func runProfileScenario(_ scenario: String, _ number: Int) {
    switch scenario {
    case "profile-ab", "profile-ab-main":
        runABScenario(onMain: scenario == "profile-ab-main")

    case "backlog":
        runBacklogScenario()

    case "profile-cost":
        // A stall of `number` ms asleep (stall 2): every CPU millisecond the
        // process spends meanwhile, beyond the sleeping thread's, is the
        // detector's. Before it, once the symbol warm-up (begun at the first answer
        // (once per process, 100-700 ms of CPU on its own thread) is over, a
        // 400 ms stall of the same function (stall 1) names its code for the
        // first time: what is measured is what sampling a stall costs.
        let queue = DispatchQueue(label: "probe.cost")
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
        watch(detector, endedCount: 2, then: finishAndExit(detector))
        queue.asyncAfter(deadline: .now() + 1.5) { profileStepB(400) }
        queue.asyncAfter(deadline: .now() + 2.5) { measuredStall { profileStepB(number) } }
        dispatchMain()

    case "activities":
        runActivitiesScenario()

    case "fatal":
        runFatalScenario()

    case "pprof":
        runPprofScenario()

    default:
        print("unknown scenario \(scenario)")
        exit(2)
    }
}

/// `profile-ab` and `profile-ab-main`.
private func runABScenario(onMain: Bool) {
    // 600 ms busy in profileStepA, then 300 ms asleep in profileStepB: the
    // profile must show both, about 2:1.
    // A first stall of 400 ms (a detector profiles its first stall from
    // `.started` on, while it names that code for the first time), then the
    // A-then-B stall, whose profile covers it from its start.
    let queue = DispatchQueue(label: "probe.profile")
    let detector = StallDetector(target: onMain ? .mainRunLoop : .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 2, then: finishAndExit(detector))
    let warmUp: @Sendable () -> Void = { profileStepB(400) }
    let work: @Sendable () -> Void = {
        StallDetector.withActivity("screen: Profile") {
            measuredStall {
                profileStepA(600)
                profileStepB(300)
            }
        }
    }
    let target = onMain ? DispatchQueue.main : queue
    target.asyncAfter(deadline: .now() + 0.3, execute: warmUp)
    target.asyncAfter(deadline: .now() + 1.2, execute: work)
    if onMain { RunLoop.main.run() } else { dispatchMain() }
}

/// `activities`.
private func runActivitiesScenario() -> Never {
    // Nested activities around a stall made by queue.sync from a thread; a
    // label that came and went before, and another thread asleep inside its
    // own activity, must not show.
    let queue = DispatchQueue(label: "probe.activities")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    Thread { StallDetector.withActivity("background sync") { _ = usleep(5_000_000) } }.start()
    Thread {
        usleep(300_000)
        _ = try? StallDetector.withActivity("gone") { throw ProbeFailure() }
        StallDetector.withActivity("screen: Settings") {
            StallDetector.withActivity("load preferences") {
                queue.sync { profileStepB(600) }
            }
        }
    }.start()
    dispatchMain()
}

/// `fatal`.
private func runFatalScenario() -> Never {
    // A stall that never ends on its own, with a fatal report: the test kills
    // this process mid-stall. Argument: the report's path.
    guard let path = CommandLine.arguments.dropFirst(2).first else {
        print("usage: stall-probe fatal <path>")
        exit(2)
    }
    let queue = DispatchQueue(label: "probe.fatal")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250), fatalReportPath: path)
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) {
        StallDetector.withActivity("screen: Checkout") {
            StallDetector.withActivity("apply coupon") {
                emit("BLOCKING")
                uniquelyNamedFatalBlocker(60_000)
            }
        }
    }
    dispatchMain()
}

/// Runs `body`, then reports the CPU the rest of the process used meanwhile.
func measuredStall(_ body: () -> Void) {
    let wallBefore = ContinuousClock.now
    let processBefore = cpuMilliseconds()
    let threadBefore = threadCPUMilliseconds()
    body()
    let thread = threadCPUMilliseconds() - threadBefore
    let process = cpuMilliseconds() - processBefore
    let wall = milliseconds(ContinuousClock.now - wallBefore)
    emit("STALLCPU \(process - thread) \(wall)")
    emit("THREADCPU \(thread)")
    emit("REAL \(wall)")
}

func threadCPUMilliseconds() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
    return Double(spec.tv_sec) * 1000 + Double(spec.tv_nsec) / 1e6
}

/// Busy for `ms`: sampled by signal.
@inline(never)
func profileStepA(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }
    blackHole(spins)
}

/// Asleep for `ms`: sampled from the kernel, without a signal.
@inline(never)
func profileStepB(_ ms: Int) {
    let start = ContinuousClock.now
    let result = usleep(UInt32(ms) * 1000)
    emit("SLEEP \(result) \(milliseconds(ContinuousClock.now - start))")
}

/// 300 items of 5 ms queued at once on a serial queue: one 1.5 s stall for the
/// work behind them, spent in backlogItem.
private func runBacklogScenario() -> Never {
    let queue = DispatchQueue(label: "probe.backlog")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    // The stall can end before the last items run (a probe posted among
    // them is answered first): REAL, queued after them, is waited for.
    let finish = finishAndExit(detector)
    watch(detector, endedCount: 1) {
        queue.sync {}
        finish()
    }
    Thread {
        usleep(300_000)
        // The items are posted behind a gate, and behind the probe a beat
        // posts meanwhile (three heartbeats: it is outstanding, so no other
        // is posted until it answers, right as the gate opens). A probe
        // posted while the items were posted would land among them, and the
        // stall would rightly start only once it answered, after the items
        // before it (on a loaded machine, most of the backlog).
        let gate = DispatchSemaphore(value: 0)
        queue.async {
            // How long the queue waited at the gate: part of the stall, and not
            // in `backlogItem` (long when the posting thread waits for a core).
            let waitStart = ContinuousClock.now
            gate.wait()
            emit("GATE \(milliseconds(ContinuousClock.now - waitStart))")
        }
        usleep(75_000)
        let start = ContinuousClock.now
        for index in 0..<300 { queue.async { backlogItem(index) } }
        emit("POSTED \(milliseconds(ContinuousClock.now - start))")
        queue.async { emit("REAL \(milliseconds(ContinuousClock.now - start))") }
        gate.signal()
    }.start()
    dispatchMain()
}

/// One item of the backlog: 5 ms of work.
@inline(never)
func backlogItem(_ index: Int) {
    let end = ContinuousClock.now + .milliseconds(5)
    var spins = index
    while ContinuousClock.now < end { spins &+= 1 }
    blackHole(spins)
}

@inline(never)
func uniquelyNamedFatalBlocker(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    while ContinuousClock.now < end { usleep(10_000) }
}

struct ProbeFailure: Error {}
