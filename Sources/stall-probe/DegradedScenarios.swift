import Dispatch
import Foundation
import StallDetection
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// Stalls in degraded environments: what a report says when the sampler cannot
// do its work. Extra output lines:
//   SECCOMP <0|errno>   whether the filter refusing process_vm_readv was installed
//   HANDLER <result>    whether the thread's own signal handler was entered
//   HOSTTICKS <count>   SIGPROF signals of the host profiler's timer its handler received

/// The scenarios this file runs.
let degradedScenarios: Set<String> = [
    "degraded-seccomp-busy", "degraded-seccomp-sleep", "degraded-sleep", "degraded-handler-replaced",
    "degraded-sigprof-blocked", "degraded-in-handler", "degraded-in-handler-altstack", "degraded-in-handler-spin",
    "degraded-in-handler-spin-altstack", "degraded-host-profiler", "degraded-host-profiler-slow",
    "degraded-sigprof-blocked-sync", "degraded-seccomp-stalled-busy", "degraded-seccomp-stalled-sleep",
    "degraded-pipes-replaced", "degraded-pipes-crossed", "degraded-in-handler-spin-smallstack",
    "degraded-foreign-tp-unreadable", "degraded-foreign-tp-zeroed", "degraded-foreign-tp-stack",
    "degraded-pools-held",
]

func runDegradedScenario(_ scenario: String, _ milliseconds: Int) {
    switch scenario {
    case "degraded-seccomp-busy", "degraded-seccomp-sleep":
        // A seccomp filter (as hardened containers install) refuses
        // process_vm_readv with EPERM in every thread, before the detector starts.
        emit("SECCOMP \(degradedRefuseProcessVMReadv(allThreads: true))")
        degradedQueueStall(milliseconds) {
            scenario.hasSuffix("busy") ? matrixBusy1($0) : degradedSleep($0)
        }
    case "degraded-seccomp-stalled-busy", "degraded-seccomp-stalled-sleep":
        // A seccomp filter refuses process_vm_readv in the stalled thread only
        // (a sandboxed worker's): its signal handler copies through a pipe.
        degradedQueueStall(milliseconds) { length in
            emit("SECCOMP \(degradedRefuseProcessVMReadv(allThreads: false))")
            // degradedSleepThrough: a loop, never a tail call that leaves no frame.
            scenario.hasSuffix("busy") ? matrixBusy1(length) : degradedSleepThrough(length)
        }
    case "degraded-pipes-replaced":
        degradedPipesReplaced(milliseconds)
    case "degraded-pipes-crossed":
        // The program copies each of the detector's pipes' write ends over its
        // read end's number (the pipe is left without a reader: a write to it
        // raises SIGPIPE); then a queue stalls, spinning.
        degradedQueueStall(milliseconds) { length in
            emit("CROSSED \(degradedCrossPipes())")
            matrixBusy1(length)
        }
    case "degraded-sleep":
        // A queue sleeping in the kernel (run with /proc unmounted by the test).
        degradedQueueStall(milliseconds) { degradedSleep($0) }
    case "degraded-handler-replaced", "degraded-sigprof-blocked":
        degradedMainRunLoopSignal(milliseconds, replacesHandler: scenario == "degraded-handler-replaced")
    case "degraded-host-profiler", "degraded-host-profiler-slow":
        degradedHostProfiler(milliseconds, slowInfoHandler: scenario.hasSuffix("-slow"))
    case "degraded-pools-held":
        degradedPoolsHeld(milliseconds)
    case "degraded-sigprof-blocked-sync":
        degradedSignalBlockedSync(milliseconds)
    case "degraded-in-handler", "degraded-in-handler-altstack", "degraded-in-handler-spin",
        "degraded-in-handler-spin-altstack", "degraded-in-handler-spin-smallstack":
        // The stalled job raises SIGUSR1; its handler sleeps (the detector reads
        // the thread from /proc) or spins (it is signalled) for the stall
        // (`READY` once it does, for a debugger to attach).
        degradedQueueStall(milliseconds) { length in
            degradedHandlerMilliseconds = Int32(length)
            degradedRaiseInHandler(
                alternateStack: scenario.hasSuffix("altstack") ? 65_536 : scenario.hasSuffix("smallstack") ? 8_192 : 0,
                spinning: scenario.contains("-spin"))
        }
    case "degraded-foreign-tp-unreadable", "degraded-foreign-tp-zeroed", "degraded-foreign-tp-stack":
        // The stalled job spins with its FS base set by hand, as a runtime with
        // threads of its own does: at unreadable memory, at zeroed memory, or at
        // its own stack. Signal samples of it must neither fault nor read there.
        let place = String(scenario.dropFirst("degraded-foreign-tp-".count))
        degradedQueueStall(milliseconds) { length in degradedForeignThreadPointerSpin(length, place: place) }
    default:
        break
    }
}

/// The program closes every pipe it did not make (the detector's copy pipes) and
/// opens files and pipes of its own at their numbers; then a queue stalls,
/// spinning.
private func degradedPipesReplaced(_ milliseconds: Int) -> Never {
    let queue = DispatchQueue(label: "probe.degraded")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    let standIns = Mutex<[DegradedStandIn]>([])
    watch(detector, endedCount: 1) {
        let leaked = standIns.withLock { $0.map { $0.bytesReceived() }.reduce(0, +) }
        emit("STANDINS \(standIns.withLock { $0.count }) LEAKED \(leaked)")
        finishAndExit(detector)()
    }
    queue.asyncAfter(deadline: .now() + 0.3) {
        standIns.withLock { $0 = degradedReplacePipes() }
        matrixBusy1(milliseconds)
    }
    dispatchMain()
}

/// The main run loop spins after a profiler replaced the SIGPROF handler
/// (`replacesHandler`), or with SIGPROF blocked in the main thread.
private func degradedMainRunLoopSignal(_ milliseconds: Int, replacesHandler: Bool) {
    let detector = StallDetector(target: .mainRunLoop, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) {
        if replacesHandler {
            signal(SIGPROF) { _ in }
        } else {
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, SIGPROF)
            pthread_sigmask(SIG_BLOCK, &set, nil)
        }
        matrixBusy1(milliseconds)
    }
    RunLoop.main.run()
}

/// The queue's job runs with SIGPROF blocked on a thread of the program's own
/// (`queue.sync` runs it on the caller), never the thread that answered the
/// detector's last probe.
private func degradedSignalBlockedSync(_ milliseconds: Int) -> Never {
    let queue = DispatchQueue(label: "probe.degraded")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    Thread {
        usleep(300_000)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGPROF)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        queue.sync { matrixBusy1(milliseconds) }
    }.start()
    dispatchMain()
}

#if arch(x86_64)
/// glibc's `arch_prctl(code, address)`.
private typealias ArchPrctl = @convention(c) (Int32, UInt) -> Int32
private let archSetFS: Int32 = 0x1002
private let archGetFS: Int32 = 0x1003

/// Spins `milliseconds` with the thread's FS base at `place` (`unreadable`: the
/// middle of a PROT_NONE mapping; `zeroed`: zeroed writable memory; `stack`: this
/// thread's stack), then puts it back. Between the two `arch_prctl` calls it
/// touches no thread-local storage (no `errno`, no runtime call): only the vDSO's
/// clock.
@inline(never)
func degradedForeignThreadPointerSpin(_ milliseconds: Int, place: String) {
    guard let libc = dlopen(nil, RTLD_NOW), let symbol = dlsym(libc, "arch_prctl") else {
        emit("FOREIGNTP unavailable")
        return
    }
    let archPrctl = unsafeBitCast(symbol, to: ArchPrctl.self)
    let size = 1 << 20
    let protection = place == "unreadable" ? PROT_NONE : PROT_READ | PROT_WRITE
    guard let region = mmap(nil, size, protection, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), region != MAP_FAILED else {
        emit("FOREIGNTP unavailable")
        return
    }
    var saved: UInt = 0
    _ = withUnsafeMutablePointer(to: &saved) { archPrctl(archGetFS, UInt(bitPattern: $0)) }
    var local: UInt = 0
    let stack = withUnsafeMutablePointer(to: &local) { (UInt(bitPattern: $0) & ~4_095) + 8_192 }
    let foreign = place == "stack" ? stack : UInt(bitPattern: region) + UInt(size / 2)
    emit("FOREIGNTP \(place) 0x\(String(foreign, radix: 16))")
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let end = Int(now.tv_sec) &* 1_000 &+ Int(now.tv_nsec) / 1_000_000 &+ milliseconds
    _ = archPrctl(archSetFS, foreign)
    var spins = 0
    repeat {
        spins &+= 1
        clock_gettime(CLOCK_MONOTONIC, &now)
    } while Int(now.tv_sec) &* 1_000 &+ Int(now.tv_nsec) / 1_000_000 < end
    _ = archPrctl(archSetFS, saved)
    munmap(region, size)
    emit("FOREIGNTP spun \(spins > 0)")
}
#else
func degradedForeignThreadPointerSpin(_ milliseconds: Int, place: String) {
    emit("FOREIGNTP unavailable")
}
#endif

/// How long the SIGUSR1 handler sleeps or spins (set before the signal is raised).
nonisolated(unsafe) private var degradedHandlerMilliseconds: Int32 = 0
/// Set when the spinning handler is to return.
private let degradedSpinStop = Atomic<Bool>(false)

/// A queue under a detector, blocked by `block(milliseconds)` after 0.3 s.
private func degradedQueueStall(_ milliseconds: Int, block: @escaping @Sendable (Int) -> Void) {
    let queue = DispatchQueue(label: "probe.degraded")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) { block(milliseconds) }
    dispatchMain()
}

/// Serial queues per quality of service the pools-held scenario blocks: more
/// than the 255 threads libdispatch on Linux starts for one.
private let degradedHeldQueues = 300
/// The held queues whose block began, per quality of service.
private let degradedHeldInteractive = Atomic<Int>(0)
private let degradedHeldInitiated = Atomic<Int>(0)

/// Every dispatch worker the serial queues of two qualities of service may
/// have held: 300 queues made with `.userInteractive` and 300 with
/// `.userInitiated`, each blocked on a semaphore (the quality of service of
/// the detector's threads before they were its own, and of its handler's);
/// then a default-QoS queue stalls `milliseconds`, reported through the
/// `onEvent` handler. Prints `HELD <user-interactive> <user-initiated>` (the
/// queues whose block began: fewer than 300 means that pool is full), the
/// events, and `STOP <ms>`, how long `stop()` took while the pools were full.
private func degradedPoolsHeld(_ milliseconds: Int) {
    let release = DispatchSemaphore(value: 0)
    for number in 0..<degradedHeldQueues {
        DispatchQueue(label: "probe.held.interactive.\(number)", qos: .userInteractive).async {
            degradedHeldInteractive.add(1, ordering: .relaxed)
            release.wait()
        }
    }
    // The pool fills within a few milliseconds; a second lets a loaded machine
    // start it too.
    usleep(1_000_000)
    for number in 0..<degradedHeldQueues {
        DispatchQueue(label: "probe.held.initiated.\(number)", qos: .userInitiated).async {
            degradedHeldInitiated.add(1, ordering: .relaxed)
            release.wait()
        }
    }
    usleep(1_000_000)
    let interactive = degradedHeldInteractive.load(ordering: .relaxed)
    emit("HELD \(interactive) \(degradedHeldInitiated.load(ordering: .relaxed))")
    let ended = DispatchSemaphore(value: 0)
    let queue = DispatchQueue(label: "probe.degraded")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250)) { event in
        report(event)
        if event.phase == .ended { ended.signal() }
    }
    detector.start()
    queue.asyncAfter(deadline: .now() + 0.3) { degradedSleep(milliseconds) }
    let waited = ended.wait(timeout: .now() + .milliseconds(milliseconds + 5_000))
    if waited == .timedOut { emit("NOEND") }
    // The names were read ahead (the warm-up, the stall's samples) on a thread
    // of the library's, not on a dispatch worker, which none of this got.
    emit("AHEAD \(degradedThreadNames().filter { $0 == "StallSymbolsPre" }.count)")
    let before = monotonicMilliseconds()
    detector.stop()
    emit("STOP \(monotonicMilliseconds() - before)")
    // The detector's threads end with its stop (the witness with the last
    // detector): how many are left 100 ms later. (The process's one naming
    // thread, `StallSymbols`, lives as long as the process, and its naming-ahead
    // thread, `StallSymbolsPre`, for 2 s after its last job: neither is a
    // detector's.)
    usleep(100_000)
    let left = degradedThreadNames().filter { $0.hasPrefix("Stall") && !$0.hasPrefix("StallSymbols") }
    emit("THREADSLEFT \(left.count) \(left)")
    for _ in 0..<(2 * degradedHeldQueues) { release.signal() }
    exit(0)
}

/// The names of the process's threads.
private func degradedThreadNames() -> [String] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.compactMap {
        (try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8))?.trimmingCharacters(in: .newlines)
    }
}

/// SIGPROF signals the host profiler's handler received.
private let degradedHostTicks = Atomic<Int>(0)
/// Signals the slow host handler got without their `siginfo_t` or with another
/// signal's, or that its timer did not send.
private let degradedHostBadInfo = Atomic<Int>(0)

/// A host profiler (gperftools, a language runtime's) installed its SIGPROF
/// handler and an `ITIMER_PROF` of 1 ms of process CPU before the detector
/// started; then 6 stalls of `milliseconds` on a queue, spinning and asleep in
/// turn, 300 ms apart. With `slowInfoHandler`, the host's handler takes its
/// `siginfo_t` (`SA_SIGINFO`) and spins 300 µs each time (a profiler that
/// unwinds in its handler).
private func degradedHostProfiler(_ milliseconds: Int, slowInfoHandler: Bool) {
    var action = sigaction()
    if slowInfoHandler {
        setInfoHandler(&action) { signal, info, _ in
            degradedHostTicks.add(1, ordering: .relaxed)
            // The timer's signals come from the kernel (SI_KERNEL), never tgkill.
            if signal != SIGPROF || info == nil || info!.pointee.si_signo != SIGPROF
                || info!.pointee.si_code == SI_TKILL
            {
                degradedHostBadInfo.add(1, ordering: .relaxed)
            }
            let end = degradedNanoseconds() + 300_000
            while degradedNanoseconds() < end {}
        }
        action.sa_flags = SA_RESTART | SA_SIGINFO
    } else {
        setPlainHandler(&action) { _ in degradedHostTicks.add(1, ordering: .relaxed) }
        action.sa_flags = SA_RESTART
    }
    sigemptyset(&action.sa_mask)
    sigaction(SIGPROF, &action, nil)
    setProfilingTimer(microseconds: 1_000)
    let queue = DispatchQueue(label: "probe.host-profiler")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 6) {
        emit("HOSTTICKS \(degradedHostTicks.load(ordering: .relaxed))")
        emit("HOSTBADINFO \(degradedHostBadInfo.load(ordering: .relaxed))")
        finishAndExit(detector)()
    }
    for index in 0..<6 {
        let start = 0.3 + Double(index) * (0.3 + Double(milliseconds) / 1_000)
        queue.asyncAfter(deadline: .now() + start) {
            if index.isMultiple(of: 2) { matrixBusy1(milliseconds) } else { degradedSleepThrough(milliseconds) }
        }
    }
    dispatchMain()
}

/// The monotonic clock in nanoseconds (async-signal-safe).
private func degradedNanoseconds() -> Int {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int(now.tv_sec) * 1_000_000_000 + Int(now.tv_nsec)
}

/// Asleep for `milliseconds`, through the signals that interrupt the sleep (the
/// host profiler's timer signals whichever thread it likes).
@inline(never)
func degradedSleepThrough(_ milliseconds: Int) {
    var request = timespec(tv_sec: milliseconds / 1_000, tv_nsec: (milliseconds % 1_000) * 1_000_000)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
}

@inline(never)
func degradedSleep(_ milliseconds: Int) {
    usleep(UInt32(milliseconds) * 1_000)
}

/// Installs the SIGUSR1 handler (on a 64 KB alternate stack if asked) and raises
/// the signal in this thread: the handler sleeps on top of this frame.
@inline(never)
func degradedRaiseInHandler(alternateStack: Int, spinning: Bool) {
    var action = sigaction()
    if spinning {
        setPlainHandler(&action) { _ in degradedSpinningHandler() }
        let milliseconds = Int(degradedHandlerMilliseconds)
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(milliseconds)) {
            degradedSpinStop.store(true, ordering: .relaxed)
        }
    } else {
        setPlainHandler(&action) { _ in degradedSleepingHandler() }
    }
    action.sa_flags = alternateStack > 0 ? SA_ONSTACK : 0
    sigemptyset(&action.sa_mask)
    sigaction(SIGUSR1, &action, nil)
    // The alternate stack, with an unreadable page below it: a handler that
    // needs more stack than is left dies at once, as on a real guard page.
    let guardPage = 4_096
    var memory: UnsafeMutableRawPointer?
    if alternateStack > 0,
        let mapped = mmap(
            nil, guardPage + alternateStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
        mapped != MAP_FAILED
    {
        mprotect(mapped, guardPage, PROT_NONE)
        memory = mapped
        var stack = signalStack(mapped + guardPage, size: alternateStack, flags: 0)
        sigaltstack(&stack, nil)
    }
    // Dispatch's worker threads block most signals.
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, SIGUSR1)
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
    emit("READY")
    pthread_kill(pthread_self(), SIGUSR1)
    if let memory {
        var none = signalStack(nil, size: 0, flags: Int32(SS_DISABLE))
        sigaltstack(&none, nil)
        munmap(memory, guardPage + alternateStack)
    }
}

/// The SIGUSR1 handler: sleeps for the stall (nanosleep is async-signal-safe).
@inline(never)
func degradedSleepingHandler() {
    var request = timespec(
        tv_sec: Int(degradedHandlerMilliseconds / 1_000),
        tv_nsec: Int(degradedHandlerMilliseconds % 1_000) * 1_000_000)
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 { request = remaining }
}

/// The spinning SIGUSR1 handler: runs user code until told to stop.
@inline(never)
func degradedSpinningHandler() {
    var spins = 0
    while !degradedSpinStop.load(ordering: .relaxed) { spins &+= 1 }
    if spins == 42 { emit("\(spins)") }
}

/// Installs, in every thread (`SECCOMP_FILTER_FLAG_TSYNC`) or in the calling one
/// only, a seccomp filter that makes `process_vm_readv` fail with EPERM and allows
/// everything else. Returns 0 or the errno. `prctl` and `syscall` are variadic in C, so Swift calls them
/// through pointers of their register-passing signatures.
func degradedRefuseProcessVMReadv(allThreads: Bool) -> Int32 {
    #if os(Linux) && (arch(x86_64) || arch(arm64))
    #if arch(x86_64)
    let (processVMReadv, seccompCall): (UInt64, Int) = (310, 317)
    #else
    let (processVMReadv, seccompCall): (UInt64, Int) = (270, 277)
    #endif
    typealias Call = @convention(c) (Int, Int, Int, Int, Int) -> Int
    // dlsym(RTLD_DEFAULT, …): glibc's RTLD_DEFAULT is a null handle.
    guard let prctlSymbol = dlsym(nil, "prctl"), let syscallSymbol = dlsym(nil, "syscall") else { return ENOSYS }
    let prctl = unsafeBitCast(prctlSymbol, to: Call.self)
    let syscall = unsafeBitCast(syscallSymbol, to: Call.self)
    // struct sock_filter { u16 code; u8 jt; u8 jf; u32 k }, one UInt64 each.
    func statement(_ code: UInt64, _ jt: UInt64, _ jf: UInt64, _ k: UInt64) -> UInt64 {
        code | jt << 16 | jf << 24 | k << 32
    }
    var filter: [UInt64] = [
        statement(0x20, 0, 0, 0),  // ld [nr]
        statement(0x15, 0, 1, processVMReadv),  // jeq #process_vm_readv, 0, 1
        statement(0x06, 0, 0, 0x0005_0000 | UInt64(EPERM)),  // ret ERRNO(EPERM)
        statement(0x06, 0, 0, 0x7FFF_0000),  // ret ALLOW
    ]
    guard prctl(38, 1, 0, 0, 0) == 0 else { return errno }  // PR_SET_NO_NEW_PRIVS
    return filter.withUnsafeMutableBufferPointer { instructions in
        // struct sock_fprog { u16 len; struct sock_filter *filter }
        var program: [Int] = [instructions.count, Int(bitPattern: instructions.baseAddress)]
        let result = program.withUnsafeMutableBufferPointer { fprog in
            // SECCOMP_SET_MODE_FILTER, with or without SECCOMP_FILTER_FLAG_TSYNC
            syscall(seccompCall, 1, allThreads ? 1 : 0, Int(bitPattern: fprog.baseAddress), 0)
        }
        return result == 0 ? 0 : errno
    }
    #else
    return ENOSYS
    #endif
}

/// A file or a pipe the program opened at a number where a pipe it closed was.
struct DegradedStandIn: Sendable {
    let descriptor: Int32
    /// The pipe's read end, for a pipe.
    let readEnd: Int32?

    /// Bytes anyone wrote into it since it was opened.
    func bytesReceived() -> Int {
        if let readEnd {
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            let count = read(readEnd, &buffer, buffer.count)
            return max(count, 0)
        }
        var status = stat()
        return fstat(descriptor, &status) == 0 ? Int(status.st_size) : -1
    }
}

/// Closes every pipe descriptor above standard error (those are the detector's:
/// the probe makes none) and opens, at each number, a file or a pipe in turn.
func degradedReplacePipes() -> [DegradedStandIn] {
    let numbers = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [])
        .compactMap { Int32($0) }.filter { $0 > 2 }.sorted()
    let pipes = numbers.filter { number in
        var status = stat()
        return fstat(number, &status) == 0 && (status.st_mode & S_IFMT) == S_IFIFO
    }
    var standIns: [DegradedStandIn] = []
    for (index, number) in pipes.enumerated() {
        close(number)
        if index % 2 == 0 {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("stand-in-\(getpid())-\(number)")
            let file = open(path.path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
            unlink(path.path)
            guard file >= 0 else { continue }
            if file != number {
                dup2(file, number)
                close(file)
            }
            standIns.append(DegradedStandIn(descriptor: number, readEnd: nil))
        } else {
            var ends: [Int32] = [0, 0]
            guard pipe(&ends) == 0 else { continue }
            _ = fcntl(ends[0], F_SETFL, O_NONBLOCK)
            // The write end goes to the number; the read end stays where it is.
            if ends[1] != number {
                dup2(ends[1], number)
                close(ends[1])
            }
            standIns.append(DegradedStandIn(descriptor: number, readEnd: ends[0]))
        }
    }
    emit("PIPES \(pipes.count)")
    return standIns
}

/// Copies each pipe's write end over its read end (a read-only descriptor whose
/// pipe is open for writing at the next number, as `pipe2` hands them out).
/// Returns how many were crossed.
func degradedCrossPipes() -> Int {
    func pipeEnd(_ number: Int32) -> (inode: UInt, access: Int32)? {
        var status = stat()
        guard fstat(number, &status) == 0, (status.st_mode & S_IFMT) == S_IFIFO else { return nil }
        return (UInt(status.st_ino), fcntl(number, F_GETFL) & O_ACCMODE)
    }
    let numbers = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [])
        .compactMap { Int32($0) }.filter { $0 > 2 }.sorted()
    var crossed = 0
    for number in numbers {
        guard let read = pipeEnd(number), read.access == O_RDONLY, let write = pipeEnd(number + 1),
            write.access == O_WRONLY, write.inode == read.inode
        else { continue }
        if dup2(number + 1, number) == number { crossed += 1 }
    }
    return crossed
}
