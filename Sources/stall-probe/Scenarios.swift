import Dispatch
import Foundation
import SafeTimers
import StallDetection

/// Prints one line and flushes it at once, so the parent sees lines as they happen.
func emit(_ line: String) {
    print(line)
    fflush(nil)
}

func milliseconds(_ duration: Duration) -> Double {
    DeadlineArithmetic.milliseconds(duration)
}

/// Monotonic milliseconds, for `BEGIN` and `RECEIVED` lines (detection latency).
func monotonicMilliseconds() -> Double {
    Double(DispatchTime.now().uptimeNanoseconds) / 1e6
}

func report(_ event: StallEvent) {
    if event.phase == .started { emit("RECEIVED \(monotonicMilliseconds())") }
    let text = Data(String(describing: event).utf8).base64EncodedString()
    emit("EVENT \(event.id) \(event.phase.rawValue) \(milliseconds(event.duration)) \(text)")
    reportProfile(event)
    if event.phase == .started {
        emit("SAMPLING \(milliseconds(event.samplingTime))")
        if !event.poolBacktraces.isEmpty {
            let naming = event.poolBacktraces.filter {
                "\($0)".contains("uniquelyNamedPoolBlocker") || "\($0)".contains("uniquelyNamedGlobalQueueBlocker")
            }
            emit("POOLTHREADS \(event.poolBacktraces.count) \(naming.count)")
            let bystanders = event.poolBacktraces.filter { "\($0)".contains("uniquelyNamedBystander") }
            emit("POOLBYSTANDERS \(bystanders.count)")
        }
        for (index, frame) in event.backtrace.frames.enumerated() {
            let location = frame.file.map { "\($0):\(frame.line ?? 0)" } ?? "-"
            emit(
                "FRAME \(index) \(String(frame.address, radix: 16)) \(frame.isInlined ? 1 : 0) "
                    + "\(frame.isUncertain ? 1 : 0) \(frame.image ?? "-") \(location)")
        }
    }
}

/// This process's resource usage (`RUSAGE_SELF`; glibc spells the constant's
/// type differently from Darwin).
func selfUsage() -> rusage {
    var usage = rusage()
    #if canImport(Glibc)
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    #else
    getrusage(RUSAGE_SELF, &usage)
    #endif
    return usage
}

func cpuMilliseconds() -> Double {
    let usage = selfUsage()
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000
}

/// Voluntary context switches of the whole process: each time one of its threads
/// went to sleep, so each wake-up counts once (preemptions by other processes, the
/// involuntary switches, do not).
func contextSwitches() -> Int {
    selfUsage().ru_nvcsw
}

/// Blocks the calling thread for `ms` milliseconds, in a function whose name the
/// tests look for in the reported stack.
@inline(never)
func uniquelyNamedQueueBlocker(_ ms: Int) {
    emit("BEGIN \(monotonicMilliseconds())")
    let start = ContinuousClock.now
    // Sleep until the deadline, resuming after signals (the stack sample
    // interrupts a sleep, as any signal does).
    while ContinuousClock.now - start < .milliseconds(ms) {
        let left = Duration.milliseconds(ms) - (ContinuousClock.now - start)
        usleep(UInt32(max(1, milliseconds(left) * 1000)))
    }
    emit("REAL \(milliseconds(ContinuousClock.now - start))")
}

/// A dispatch block on the global queue that sleeps `ms` (once, resumed after a
/// signal), in `pool-global`. Its body differs from the other blockers' (see
/// `uniquelyNamedPoolBlocker`).
@inline(never)
func uniquelyNamedGlobalQueueBlocker(_ ms: Int) {
    let start = ContinuousClock.now
    emit("BEGIN \(monotonicMilliseconds())")
    var request = timespec(tv_sec: ms / 1000, tv_nsec: (ms % 1000) * 1_000_000)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 { request = remaining }
    emit("REAL \(milliseconds(ContinuousClock.now - start)) global")
}

/// Work that runs beside a pool stall on threads that are not the probe's pool
/// (another priority's pool, a serial queue's thread): never to be blamed.
@inline(never)
func uniquelyNamedBystander(_ ms: Int) {
    let end = ContinuousClock.now + .milliseconds(ms)
    while ContinuousClock.now < end { usleep(5_000) }
    emit("BYSTANDER done")
}

/// Blocks a thread of the cooperative pool (in a task) for `ms` milliseconds. Its
/// body must differ from `uniquelyNamedQueueBlocker`'s: a release build merges
/// functions with identical bodies (`…Tm`), and the merged code has no file:line.
@inline(never)
func uniquelyNamedPoolBlocker(_ ms: Int) {
    emit("BEGIN \(monotonicMilliseconds())")
    let start = ContinuousClock.now
    // One sleep, resumed after a signal with what is left.
    var request = timespec(tv_sec: ms / 1000, tv_nsec: (ms % 1000) * 1_000_000)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 { request = remaining }
    emit("REAL \(milliseconds(ContinuousClock.now - start))")
}

@inline(never)
func uniquelyNamedMainThreadBlocker(_ ms: Int) {
    let start = ContinuousClock.now
    // Busy, so that the stack shows this function itself, not only a sleep.
    while ContinuousClock.now - start < .milliseconds(ms) {}
    emit("REAL \(milliseconds(ContinuousClock.now - start))")
}

func watch(
    _ detector: StallDetector, endedCount: Int, priority: TaskPriority? = nil,
    then finish: @escaping @Sendable () -> Void
) {
    detector.start()
    Task.detached(priority: priority) {
        var ended = 0
        for await event in detector.events {
            report(event)
            if event.phase == .ended {
                ended += 1
                if ended == endedCount { finish() }
            }
        }
    }
}

func finishAndExit(_ detector: StallDetector) -> @Sendable () -> Void {
    {
        detector.stop()
        emit("CPU \(cpuMilliseconds())")
        exit(0)
    }
}

/// The process' CPU milliseconds and voluntary context switches over `seconds`
/// of this thread asleep: one sleep for the whole measurement (a stop and
/// continue restart it), so the main thread adds no wake-up of its own.
func idleCost(seconds: Int) -> (cpu: Double, switches: Int) {
    let before = cpuMilliseconds()
    let switchesBefore = contextSwitches()
    var request = timespec(tv_sec: seconds, tv_nsec: 0)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 { request = remaining }
    return (cpuMilliseconds() - before, contextSwitches() - switchesBefore)
}
