// A stall in a process the size of a server: SwiftNIO linked and running (event
// loops parked in `epoll_wait`), many idle threads (half started before the
// detector, half after), and one first stall of a serial queue, 600 ms spinning in
// `serverStepA` then 300 ms asleep in `serverStepB` (truth 2 : 1).
//
//   stall-server-probe [--threads N] [--loops L] [--target queue|loop] [--async] [--runs R]
//                      [--idle-heartbeat MS]
//
// `--threads` is the number of idle threads in all (NIO's loops included, default
// 64); `--target loop` watches a NIO event loop (`.custom`) that stalls instead of
// a dispatch queue. With `--async` (loop only) the stall runs in async code: an
// actor whose executor is the event loop awaits serverRoute → serverHandler, each
// after a `Task.yield()`, and the handler stalls. Each run is one fresh detector
// and one stall; a process serves `--runs` of them (default 1: a fresh process's
// first stall). `--idle-heartbeat` gives the detector that `idleHeartbeat` (the
// heartbeat is 25 ms). Prints one line per run:
//
//   RUN <n> started <ms after threshold> stack <0|1> awaits <0|1> samples <n> A <n> B <n>
//       detectorCPU <% of a core during the stall> startCPU <ms>
//
// `awaits` says whether `.started` named serverRoute as an awaiting caller (always
// 1 without `--async`).
//
// and `BINARY <bytes>` first. A run whose report lost the stack prints `stack 0`
// and the reason.

import Dispatch
import Foundation
import NIOCore
import NIOPosix
import StallDetection
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

func argument(_ name: String, default value: Int) -> Int {
    let arguments = CommandLine.arguments
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return value }
    return Int(arguments[index + 1]) ?? value
}

func emit(_ line: String) {
    print(line)
    fflush(nil)
}

func processCPUNanoseconds() -> Int64 {
    var spec = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &spec)
    return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
}

func threadCPUNanoseconds() -> Int64 {
    var spec = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
    return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
}

func monotonicNanoseconds() -> Int64 { Int64(DispatchTime.now().uptimeNanoseconds) }

/// Spins for `ms` (the stall's first part).
@inline(never)
func serverStepA(_ ms: Int) {
    let end = monotonicNanoseconds() + Int64(ms) * 1_000_000
    var spins = 0
    while monotonicNanoseconds() < end { spins &+= 1 }
    withExtendedLifetime(spins) {}
}

/// Sleeps for `ms` (the stall's second part).
@inline(never)
func serverStepB(_ ms: Int) {
    let result = usleep(UInt32(ms) * 1_000)
    // Used after the call, so that the call is not a tail call (which would leave
    // no frame of this function on the stack).
    if result != 0 { emit("SLEEP \(result)") }
}

/// An actor whose executor is a NIO event loop, as a server's per-connection
/// state often is.
actor LoopActor {
    let loop: any EventLoop
    init(loop: any EventLoop) { self.loop = loop }
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.executor.asUnownedSerialExecutor() }

    @inline(never)
    func serve(_ stall: @Sendable () -> Void) async {
        await serverRoute(stall)
    }
}

@inline(never)
func serverRoute(_ stall: @Sendable () -> Void, isolation: isolated (any Actor)? = #isolation) async {
    await Task.yield()
    await serverHandler(stall)
    emit("", if: false)
}

@inline(never)
func serverHandler(_ stall: @Sendable () -> Void, isolation: isolated (any Actor)? = #isolation) async {
    await Task.yield()
    stall()
    emit("", if: false)
}

/// Prints `line` when `condition` holds (keeps the calls above from being tail calls).
func emit(_ line: String, if condition: Bool) { if condition { emit(line) } }

/// Threads that wait forever, as a server's idle workers and drivers do.
func startIdleThreads(_ count: Int) {
    for _ in 0..<max(0, count) {
        let thread = Thread {
            let condition = NSCondition()
            condition.lock()
            while true { condition.wait() }
        }
        thread.stackSize = 256 * 1_024
        thread.start()
    }
}

/// What one stall measured.
struct Outcome: Sendable {
    var startedAfterThreshold: Double = -1
    var hasStack = false
    var namesAwaits = false
    var reason = ""
    var samples = 0
    var a = 0
    var b = 0
}

let threads = argument("--threads", default: 64)
let loops = min(threads, argument("--loops", default: 8))
let runs = argument("--runs", default: 1)
let onLoop = CommandLine.arguments.contains("loop")  // `--target loop`
let inAsyncCode = onLoop && CommandLine.arguments.contains("--async")
let verbose = CommandLine.arguments.contains("--verbose")
let threshold = Duration.milliseconds(250)
/// `--idle-heartbeat <ms>`: the detector's `idleHeartbeat` (none by default).
let idleHeartbeat = argument("--idle-heartbeat", default: 0)

let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
let attributes = try? FileManager.default.attributesOfItem(atPath: executable)
emit("BINARY \((attributes?[.size] as? Int) ?? 0)")

let group = MultiThreadedEventLoopGroup(numberOfThreads: loops)
let idle = threads - loops
startIdleThreads(idle / 2)

let outcome = Mutex<Outcome>(Outcome())

func watch(_ detector: StallDetector, stallBegin: @escaping @Sendable () -> Int64, done: DispatchSemaphore) {
    Task.detached {
        for await event in detector.events {
            let profile = event.profile
            let share = { (name: String) in profile.functions.first { $0.name.contains(name) }?.samples ?? 0 }
            switch event.phase {
            case .started:
                let late = Double(monotonicNanoseconds() - stallBegin()) / 1e6 - 250
                let frames = event.backtrace.frames
                let named = frames.contains { $0.function?.contains("serverStep") ?? false }
                let awaits = frames.contains { $0.isAwaiting && ($0.function?.hasPrefix("serverRoute(") ?? false) }
                outcome.withLock {
                    $0.startedAfterThreshold = late
                    $0.hasStack = named
                    $0.namesAwaits = !inAsyncCode || awaits
                    $0.reason = event.backtrace.unavailableReason ?? (named ? "" : "\(event.backtrace)")
                }
            case .ended:
                outcome.withLock {
                    ($0.samples, $0.a, $0.b) = (profile.sampleCount, share("serverStepA"), share("serverStepB"))
                }
                if verbose { emit("\(event)") }
                done.signal()
            }
        }
    }
}

for run in 1...runs {
    outcome.withLock { $0 = Outcome() }
    let queue = DispatchQueue(label: "server.stalled")
    let loop = group.next()
    let target: StallDetector.Target =
        onLoop ? .custom(name: "event loop") { probe in loop.execute(probe) } : .queue(queue)
    let cpuBeforeStart = processCPUNanoseconds()
    let detector = StallDetector(
        target: target, threshold: threshold, idleHeartbeat: idleHeartbeat > 0 ? .milliseconds(idleHeartbeat) : nil)
    detector.start()
    if run == 1 { startIdleThreads(idle - idle / 2) }
    // Let start-up settle: what the detector spent starting is measured over 1 s.
    usleep(1_000_000)
    let startCPU = Double(processCPUNanoseconds() - cpuBeforeStart) / 1e6
    let begin = Atomic<Int64>(0)
    let done = DispatchSemaphore(value: 0)
    watch(detector, stallBegin: { begin.load(ordering: .acquiring) }, done: done)
    let stalled = DispatchSemaphore(value: 0)
    let cpu = Atomic<Int64>(0)
    let stall: @Sendable () -> Void = {
        let processBefore = processCPUNanoseconds()
        let threadBefore = threadCPUNanoseconds()
        begin.store(monotonicNanoseconds(), ordering: .releasing)
        serverStepA(600)
        serverStepB(300)
        let others = (processCPUNanoseconds() - processBefore) - (threadCPUNanoseconds() - threadBefore)
        cpu.store(others, ordering: .releasing)
        stalled.signal()
    }
    if inAsyncCode {
        let actor = LoopActor(loop: loop)
        Task.detached { await actor.serve(stall) }
    } else if onLoop {
        loop.execute(stall)
    } else {
        queue.async(execute: stall)
    }
    stalled.wait()
    let finished = done.wait(timeout: .now() + 10) == .success
    detector.stop()
    let measured = outcome.withLock { $0 }
    let detectorShare = Double(cpu.load(ordering: .acquiring)) / 9e8 * 100
    emit(
        "RUN \(run) started \(String(format: "%.0f", measured.startedAfterThreshold)) stack \(measured.hasStack ? 1 : 0) "
            + "awaits \(measured.namesAwaits ? 1 : 0) "
            + "samples \(measured.samples) A \(measured.a) B \(measured.b) "
            + "detectorCPU \(String(format: "%.1f", detectorShare)) startCPU \(String(format: "%.0f", startCPU))"
            + (finished ? "" : " ended-missing")
            + (measured.hasStack ? "" : " reason: \(measured.reason.prefix(200))"))
    usleep(300_000)
}
try? group.syncShutdownGracefully()
exit(0)
