import Dispatch
import Foundation
import StallDetection

#if canImport(Glibc)
import Glibc
#endif

// The sampler at its edges. Extra output lines (besides PROFILE and FUNCTION):
//   FDS <label> <open descriptors>        /proc/self/fd entries at a point of the scenario
//   OPENED <0|1> <errno>                  whether the program could still open a file after a stall
//   SLEEPS <sleeps> <cut short>           sleeps of the stalled job and how many a signal ended early

/// The scenarios this file runs.
let samplerEdgeCaseScenarios: Set<String> = [
    "sampler-phases", "sampler-masked", "sampler-masked-only", "sampler-nofile", "sampler-pool-crowd",
    "sampler-custom-crowd",
    "sampler-tailcall", "sampler-sleep-cut",
]

func runSamplerEdgeCaseScenario(_ scenario: String, _ number: Int) {
    let queue = DispatchQueue(label: "probe.sampler")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    defer { withExtendedLifetime(detector) {} }
    switch scenario {
    case "sampler-phases":
        runPhasesScenario(number, queue: queue, detector: detector)

    case "sampler-masked":
        // A warm-up stall, then a stall asleep for `number` ms, then spinning for
        // `number` ms with SIGPROF blocked (as code that masks signals does).
        watchWithProfile(detector, endedCount: 2)
        queue.asyncAfter(deadline: .now() + 0.3) { samplerEdgeCaseWarmUp(400) }
        queue.asyncAfter(deadline: .now() + 1.2) {
            measuredStall {
                samplerEdgeCaseSleepPhase(number)
                samplerEdgeCaseMaskedSpinPhase(number)
            }
        }
        dispatchMain()

    case "sampler-masked-only":
        // A warm-up stall, then `number` ms spinning with SIGPROF blocked: the
        // detector's samples before the threshold wait for an answer that never
        // comes; `.started` must still come on time.
        watchWithProfile(detector, endedCount: 2)
        queue.asyncAfter(deadline: .now() + 0.3) { samplerEdgeCaseWarmUp(400) }
        queue.asyncAfter(deadline: .now() + 1.2) { measuredStall { samplerEdgeCaseMaskedSpinPhase(number) } }
        dispatchMain()

    case "sampler-pool-crowd", "sampler-custom-crowd":
        runCrowdScenario(scenario, number, queue: queue)

    case "sampler-sleep-cut":
        // One stall of `number` ms (default 3 s) that alternates 1 ms of spinning
        // with 1 ms asleep, so that looks often find the thread running just
        // before it sleeps: a signal sent then ends the sleep early (EINTR).
        watchWithProfile(detector, endedCount: 1)
        queue.asyncAfter(deadline: .now() + 0.3) { samplerEdgeCaseSpinSleep(number) }
        dispatchMain()

    case "sampler-tailcall":
        // Two stalls in a function the job's closure reaches by a tail call (a
        // release build compiles `{ samplerEdgeCaseSleepPhase(500) }` to `jmp`).
        watchWithProfile(detector, endedCount: 2)
        queue.asyncAfter(deadline: .now() + 0.2) { samplerEdgeCaseSleepPhase(number) }
        queue.asyncAfter(deadline: .now() + 0.4 + Double(number) / 1000) { samplerEdgeCaseSleepPhase(number) }
        dispatchMain()

    case "sampler-nofile":
        runNoFileScenario(number, queue: queue, detector: detector)

    default:
        emit("unknown scenario \(scenario)")
        exit(2)
    }
}

/// `sampler-phases`.
private func runPhasesScenario(_ number: Int, queue: DispatchQueue, detector: StallDetector) -> Never {
    // A warm-up stall, then stalls of four phases of `number` ms each: asleep
    // in usleep, spinning, blocked in read(2) on a pipe, asleep in a futex. Each
    // must get about a quarter of the samples.
    // The same stall twice: the second names nothing new, so its STALLCPU is
    // sampling alone (the naming allowance is spent by then).
    watchWithProfile(detector, endedCount: 3)
    queue.asyncAfter(deadline: .now() + 0.3) { samplerEdgeCaseWarmUp(400) }
    let phases: @Sendable () -> Void = {
        measuredStall {
            samplerEdgeCaseSleepPhase(number)
            samplerEdgeCaseSpinPhase(number)
            samplerEdgeCaseReadPhase(number)
            samplerEdgeCaseFutexPhase(number)
        }
    }
    queue.asyncAfter(deadline: .now() + 1.2, execute: phases)
    queue.asyncAfter(deadline: .now() + 1.6 + 4 * Double(number) / 1000, execute: phases)
    dispatchMain()
}

/// `sampler-pool-crowd` and `sampler-custom-crowd`.
private func runCrowdScenario(_ scenario: String, _ number: Int, queue: DispatchQueue) -> Never {
    // `number` idle threads made first (the lowest thread ids, so listed first
    // in /proc/self/task), then the whole cooperative pool blocked for 800 ms,
    // or a custom executor's queue: the blocker must still be found.
    let crowd = DispatchSemaphore(value: 0)
    for _ in 0..<number { Thread { crowd.wait() }.start() }
    usleep(100_000)
    if scenario == "sampler-pool-crowd" {
        let pool = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
        watch(pool, endedCount: 1, priority: .high, then: finishAndExit(pool))
        let width = ProcessInfo.processInfo.activeProcessorCount
        DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
            for _ in 0..<width { Task.detached(priority: .medium) { uniquelyNamedPoolBlocker(800) } }
        }
    } else {
        let custom = StallDetector(
            target: .custom(name: "custom executor") { probe in queue.async(execute: probe) },
            threshold: .milliseconds(250))
        watch(custom, endedCount: 1, then: finishAndExit(custom))
        queue.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedQueueBlocker(800) }
    }
    dispatchMain()
}

/// `sampler-nofile`.
private func runNoFileScenario(_ number: Int, queue: DispatchQueue, detector: StallDetector) -> Never {
    // The process uses every descriptor its limit allows but `number`; then
    // two stalls. Reports must say why a stack is missing, and the program
    // must still have its `number` descriptors afterwards.
    emit("FDS start \(samplerEdgeCaseOpenDescriptors())")
    var limit = openFilesLimit()
    let open = samplerEdgeCaseOpenDescriptors()
    limit.rlim_cur = rlim_t(open + 40)
    setOpenFilesLimit(limit)
    watchWithProfile(detector, endedCount: 2)
    // libdispatch opens descriptors lazily, once each, and crashes when it
    // cannot (SIGILL): its manager's epoll, eventfd and timer, its worker
    // monitor's timer, the main queue's eventfd under dispatchMain(). The
    // filling waits until all exist, whatever the machine's load: a timer has
    // fired on a worker, and the main queue runs under dispatchMain(). The
    // detector's own descriptors (its thread, its stop witness) are open by then.
    DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
        DispatchQueue.main.async { samplerEdgeCaseFillAndStall(number, queue: queue) }
    }
    dispatchMain()
}

/// Opens `/dev/null` until no descriptor is left, closes `number` of them, then
/// two stalls of `queue` and the report of what the program can still open.
private func samplerEdgeCaseFillAndStall(_ number: Int, queue: DispatchQueue) {
    var filler: [Int32] = []
    while true {
        let descriptor = openReadOnly("/dev/null")
        if descriptor < 0 { break }
        filler.append(descriptor)
    }
    for _ in 0..<max(0, number) { if let last = filler.popLast() { close(last) } }
    emit("FDS filled \(samplerEdgeCaseOpenDescriptors()) free \(number)")
    queue.asyncAfter(deadline: .now() + 0.2) { samplerEdgeCaseSleepPhase(500) }
    queue.asyncAfter(deadline: .now() + 1.2) { samplerEdgeCaseSleepPhase(500) }
    queue.asyncAfter(deadline: .now() + 1.8) { samplerEdgeCaseReportDescriptors(number) }
}

/// After the `sampler-nofile` stalls: whether the program can still open its
/// `number` descriptors, and which descriptors other than `/dev/null` are open.
private func samplerEdgeCaseReportDescriptors(_ number: Int) {
    var opened: [Int32] = []
    var failure: Int32 = 0
    for _ in 0..<max(0, number) {
        let descriptor = openReadOnly("/dev/null")
        if descriptor < 0 {
            failure = errno
            break
        }
        opened.append(descriptor)
    }
    emit("OPENED \(opened.count) \(failure)")
    for descriptor in opened { close(descriptor) }
    emit("FDS end \(samplerEdgeCaseOpenDescriptors())")
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
        if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)"),
            target != "/dev/null"
        {
            emit("FD \(entry) \(target)")
        }
    }
}

/// `watch` that also prints each `.ended` profile.
private func watchWithProfile(_ detector: StallDetector, endedCount: Int) {
    detector.start()
    Task.detached {
        var ended = 0
        for await event in detector.events {
            report(event)
            if event.phase == .ended {
                ended += 1
                if ended == endedCount {
                    // Let the scenario's last block print, then end.
                    usleep(300_000)
                    finishAndExit(detector)()
                }
            }
        }
    }
}

func samplerEdgeCaseOpenDescriptors() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

@inline(never)
func samplerEdgeCaseWarmUp(_ ms: Int) {
    // Not a tail call, and not the same code as samplerEdgeCaseSleepPhase (which
    // identical code folding would merge into one symbol).
    blackHole(Int(usleep(UInt32(ms) * 1000)) &+ 7)
}

@inline(never)
func samplerEdgeCaseSleepPhase(_ ms: Int) {
    // Not a tail call: this function's frame stays on the stack.
    blackHole(Int(usleep(UInt32(ms) * 1000)))
}

@inline(never)
func samplerEdgeCaseSpinPhase(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }
    blackHole(spins)
}

@inline(never)
func samplerEdgeCaseReadPhase(_ ms: Int) {
    var ends: [Int32] = [0, 0]
    guard pipe(&ends) == 0 else { return }
    let writer = ends[1]
    Thread {
        usleep(UInt32(ms) * 1000)
        var byte: UInt8 = 1
        _ = write(writer, &byte, 1)
    }.start()
    var byte: UInt8 = 0
    _ = read(ends[0], &byte, 1)
    close(ends[0])
    close(ends[1])
}

@inline(never)
func samplerEdgeCaseFutexPhase(_ ms: Int) {
    let semaphore = DispatchSemaphore(value: 0)
    _ = semaphore.wait(timeout: .now() + .milliseconds(ms))
}

@inline(never)
func samplerEdgeCaseMaskedSpinPhase(_ ms: Int) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, SIGPROF)
    var old = sigset_t()
    pthread_sigmask(SIG_BLOCK, &set, &old)
    samplerEdgeCaseSpinPhase(ms)
    pthread_sigmask(SIG_SETMASK, &old, nil)
}

/// Alternates 1 ms of spinning with 1 ms asleep for `ms` and prints how many
/// sleeps a signal cut short (`SLEEPS`).
@inline(never)
func samplerEdgeCaseSpinSleep(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    var (sleeps, cut) = (0, 0)
    while ContinuousClock.now < end {
        let spinEnd = ContinuousClock.now + .milliseconds(1)
        while ContinuousClock.now < spinEnd {}
        var request = timespec(tv_sec: 0, tv_nsec: 1_000_000)
        var left = timespec()
        sleeps += 1
        if nanosleep(&request, &left) != 0 && errno == EINTR { cut += 1 }
    }
    emit("SLEEPS \(sleeps) \(cut)")
}
