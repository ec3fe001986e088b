import CStallCapture

/// Everything the detector queue needs to sample and name a blocked thread: the
/// sampler, the symbolicator and its cache.
///
/// `@unchecked Sendable` invariant: every method is called on the owning
/// detector's serial queue only (`DetectorCore.detectorQueue`), so the mutable
/// sampler and symbolicator are never used by two threads at once.
final class SamplingContext: @unchecked Sendable {
    private var sampler: StackSampler?
    private var symbolicator: Symbolicator?
    private var installError: String?
    /// Calls and wrappers' tail jumps decoded in earlier samples (each read its
    /// code, PLT stub and GOT slot through the kernel), and the image map they
    /// belong to.
    private let code = StackUnwinder.CodeCache()
    private var codeGeneration = 0

    /// Closes the `/proc` files kept open for the sampled threads (a stall
    /// ended: the program may need the descriptors).
    func releaseFiles() {
        sampler?.files.closeAll()
    }

    /// Installs the signal handler and loads symbols before the first stall.
    func warmUp() {
        _ = prepared()
        symbolicator?.warmUp()
    }

    /// CPU nanoseconds spent so far naming addresses seen for the first time.
    var namingCost: Int64 { symbolicator?.namingCost ?? 0 }

    private func prepared() -> (StackSampler, Symbolicator) {
        if let sampler, let symbolicator { return (sampler, symbolicator) }
        installError = StackSampler.install()
        let made = (StackSampler(timeout: .milliseconds(100)), Symbolicator())
        (sampler, symbolicator) = made
        return made
    }

    /// The id a report shows for kernel thread `thread`: the Linux tid. (Apple
    /// platforms have no sampler yet, so their reports carry no thread id rather
    /// than a wrong one.)
    private static func reportedID(_ thread: Int32) -> UInt64? {
        #if os(Linux)
        return UInt64(UInt32(bitPattern: thread))
        #else
        return nil
        #endif
    }

    /// How much of a sleeping thread's stack a sample copies first: most stacks
    /// end well within it (a thread's stack is followed by whatever is mapped
    /// above it, a malloc arena's heap for some: copying up to 256 KB of that
    /// was most of such a sample's cost). A copy that ends before the stack's
    /// root is taken again whole.
    static let firstKernelCopyBytes = 32 * 1_024

    /// Samples one thread and names its frames.
    func backtrace(of thread: Int32) -> StallBacktrace {
        let (sampler, _) = prepared()
        let first = sampler.capture(thread: thread, kernelCopyLimit: Self.firstKernelCopyBytes)
        let (backtrace, wentBeyond) = named(first, thread: thread)
        if case .copied(let copy, signalled: false) = first, copy.truncated, wentBeyond || backtrace.isTruncated {
            return named(sampler.capture(thread: thread), thread: thread).backtrace
        }
        return backtrace
    }

    /// Unwinds and names a captured stack; also whether the unwind followed the
    /// chain beyond the copy.
    private func named(
        _ outcome: StackSampler.Outcome, thread: Int32
    ) -> (backtrace: StallBacktrace, wentBeyondCopy: Bool) {
        let (_, symbolicator) = prepared()
        switch outcome {
        case .unavailable(let reason):
            return (.unavailable(reason, threadID: Self.reportedID(thread)), false)
        case .runningUnsampled(let reason):
            return (.unavailableWhileRunning(reason, threadID: Self.reportedID(thread)), false)
        case .copied(let copy, let signalled):
            if signalled, let installError {
                return (.unavailable(installError, threadID: Self.reportedID(thread)), false)
            }
            let blocks = MemoryBlocks()
            if codeGeneration != symbolicator.imageGeneration {
                code.removeAll()
                codeGeneration = symbolicator.imageGeneration
            }
            let unwinder = StackUnwinder(
                copy: copy, isText: symbolicator.isTextAddress,
                readWord: { blocks.word(at: $0) },
                exactStart: { candidate, inner, innerIsReturnAddress in
                    // Both in the main executable, whose symbol table is complete; a
                    // call into a library may reach its target through a tail call
                    // (`qsort` to `qsort_r`).
                    guard symbolicator.isInExecutable(candidate), symbolicator.isInExecutable(inner) else {
                        return nil
                    }
                    return symbolicator.functionStart(of: inner, isReturnAddress: innerIsReturnAddress)
                }, codeCache: code)
            let frames = StackShape.prune(symbolicator.symbolicate(unwinder.unwind()))
            let backtrace = StallBacktrace(
                frames: frames, threadID: Self.reportedID(thread), unavailableReason: nil,
                isTruncated: copy.truncated && !StackShape.reachesRoot(frames))
            return (backtrace, unwinder.wentBeyondCopy)
        }
    }

    /// Samples the thread that is most likely blocked: the main thread for the
    /// main run loop; for a custom executor, see `sampleCustomExecutor`;
    /// otherwise the first thread seen running a job for a queue or run loop, among
    /// the candidates in order (the main thread for the main queue, the thread that
    /// answered the last probe, then every other thread); failing that, the first
    /// thread that is neither idle nor unreadable. Returns the chosen backtrace and
    /// every sample taken (keyed by thread), so the `.ended` event can use the one
    /// of the thread that finally answered.
    ///
    /// With `candidatesOnly`, the other threads are not tried (the profile's
    /// samples before the threshold, which must not hold up the detector's looks).
    func sampleBlockedThread(
        target: StallDetector.Target, lastAnswering: Int32?, candidatesOnly: Bool = false
    ) -> (StallBacktrace, [Int32: StallBacktrace]) {
        if case .custom = target { return sampleCustomExecutor(lastAnswering: lastAnswering) }
        if case .cooperativePool = target { return sampleCooperativePool() }
        let mainThread = ProcessFacts.mainThreadID
        var candidates: [Int32] = []
        switch target {
        case .mainRunLoop:
            candidates = [mainThread]
        case .mainQueue:
            candidates = [mainThread] + (lastAnswering.map { [$0] } ?? [])
        case .queue, .custom, .cooperativePool:
            candidates = lastAnswering.map { [$0] } ?? []
        }
        var samples: [Int32: StallBacktrace] = [:]
        var firstFailure: StallBacktrace?
        var firstIdle: StallBacktrace?
        var firstOther: StallBacktrace?
        /// Samples `threads`; returns the first that runs a job for a queue or run
        /// loop, if any; remembers the others by kind.
        func sample(_ threads: [Int32], alone: Bool) -> StallBacktrace? {
            for thread in threads {
                let backtrace = backtrace(of: thread)
                if backtrace.unavailableReason != nil {
                    if firstFailure == nil { firstFailure = backtrace }
                    continue
                }
                samples[thread] = backtrace
                if alone || StackShape.runsJob(backtrace.frames) { return backtrace }
                if Self.isIdle(backtrace, thread: thread) {
                    if firstIdle == nil { firstIdle = backtrace }
                } else if firstOther == nil {
                    firstOther = backtrace
                }
            }
            return nil
        }
        let alone = !target.usesHeartbeat && candidates.count == 1
        if let found = sample(candidates, alone: alone) { return (found, samples) }
        if target.usesHeartbeat && !candidatesOnly {
            // No likely thread runs a job: every other thread, once.
            let own = stallcapture_current_tid()
            let others = ProcessFacts.threads().filter { id, name in
                id != own && !candidates.contains(id) && !Self.ignoredThreadNames.contains(name)
            }.map(\.id)
            if let found = sample(Self.sleepersFirst(Array(others.prefix(48))), alone: false) {
                return (found, samples)
            }
        }
        // An idle thread is never the blocked one: a thread that could not be
        // sampled (and says why) is the more honest answer.
        return (firstOther ?? firstFailure ?? firstIdle ?? .unavailable("no thread to sample"), samples)
    }

    /// A custom executor's thread is the one that last ran a probe (an event
    /// loop's thread): it is sampled first, and taken unless it waits for work.
    /// If it does (a dispatch queue's jobs move from worker to worker), the first
    /// other thread running a dispatch job is taken; failing that, the waiting
    /// thread's sample (the second look then reports it). Never the detector's own
    /// thread.
    private func sampleCustomExecutor(lastAnswering: Int32?) -> (StallBacktrace, [Int32: StallBacktrace]) {
        let own = stallcapture_current_tid()
        var samples: [Int32: StallBacktrace] = [:]
        guard let thread = lastAnswering, thread != own else {
            let unknown =
                lastAnswering == nil
                ? "no probe has run yet, so the executor's thread is unknown"
                : "the last probe ran inside `post`, on the detector's own thread"
            return (.unavailable(unknown), samples)
        }
        let lastProbeSample = backtrace(of: thread)
        if lastProbeSample.unavailableReason == nil {
            samples[thread] = lastProbeSample
            if !Self.isIdle(lastProbeSample, thread: thread) { return (lastProbeSample, samples) }
        }
        let others = ProcessFacts.threads().filter { id, name in
            id != own && id != lastAnswering && !Self.ignoredThreadNames.contains(name)
        }.map(\.id)
        for thread in Self.sleepersFirst(Array(others.prefix(48))) {
            let backtrace = backtrace(of: thread)
            guard backtrace.unavailableReason == nil else { continue }
            samples[thread] = backtrace
            if StackShape.runsJob(backtrace.frames) { return (backtrace, samples) }
        }
        return (lastProbeSample, samples)
    }

    /// Every thread running a Swift job (at most 48 threads are looked at): the
    /// pool's blocked threads. Returns the first and all of them, keyed by thread.
    private func sampleCooperativePool() -> (StallBacktrace, [Int32: StallBacktrace]) {
        let own = stallcapture_current_tid()
        var samples: [Int32: StallBacktrace] = [:]
        var first: StallBacktrace?
        // The main thread is never a pool thread (it runs an async `main` or the
        // main actor's jobs with the same frames).
        let mainThread = ProcessFacts.mainThreadID
        let candidates = ProcessFacts.threads().filter { id, name in
            id != own && id != mainThread && !Self.ignoredThreadNames.contains(name)
        }
        // Dispatch's workers first (the pool's threads are among them, named
        // after their root queue, "…qos…"): with many threads of its own, a
        // program's pool threads were beyond the 48 looked at.
        let threads =
            candidates.filter { $0.name.contains("qos") }.map(\.id)
            + candidates.filter { !$0.name.contains("qos") }.map(\.id)
        for thread in threads.prefix(48) {
            let backtrace = backtrace(of: thread)
            guard backtrace.unavailableReason == nil, StackShape.runsSwiftJob(backtrace.frames) else { continue }
            samples[thread] = backtrace
            if first == nil { first = backtrace }
        }
        return (first ?? .unavailable("no thread was running a Swift job"), samples)
    }

    /// Whether a sampled thread waits for work: its stack says so, or (Linux) the
    /// kernel says it sleeps in `epoll_wait` with no job on its stack (an event
    /// loop parked; the C library's frames may have no names).
    static func isIdle(_ sample: StallBacktrace, thread: Int32) -> Bool {
        if StackShape.looksIdle(sample.frames) { return true }
        return !StackShape.runsJob(sample.frames) && ThreadState.isInEventWait(thread: thread)
    }

    /// `threads` with those asleep in the kernel first, in their order, then the
    /// running ones. A sleeping thread is read without a signal; a running one
    /// gets a `SIGPROF`, which cuts short a long system call it is in (a big
    /// `read` returns what it has), so bystanders are signalled only when no
    /// sleeping thread turned out to run the job.
    /// Among running threads, those that spent more of their time in user code
    /// than in the kernel come first (a spinning job before a thread copying a big
    /// `read`).
    static func sleepersFirst(_ threads: [Int32]) -> [Int32] {
        #if os(Linux)
        var sleeping: [Int32] = []
        var running: [(thread: Int32, inKernel: Bool)] = []
        for thread in threads {
            guard let stat = ProcFile.read("/proc/self/task/\(thread)/stat"),
                let close = stat.lastIndex(of: ")")
            else { continue }
            // After the command: state (field 3), …, utime (14), stime (15).
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 12, fields[0] == "R" else {
                sleeping.append(thread)
                continue
            }
            running.append((thread, (Int(fields[12]) ?? 0) > (Int(fields[11]) ?? 0)))
        }
        return sleeping + running.filter { !$0.inKernel }.map(\.thread) + running.filter(\.inKernel).map(\.thread)
        #else
        return threads
        #endif
    }

    /// Threads that are never the blocked one: detectors, the stop witness and
    /// SafeTimers' scheduler.
    private static let ignoredThreadNames: Set<String> = ["StallDetector", "StallStopWitnes", "SafeTimers"]
}

/// Reading a sampled stack: is the thread running a job, or waiting for one?
enum StackShape {
    /// Frames that mean the thread runs somebody's code for a queue or run loop.
    static let busyMarkers = [
        "_dispatch_client_callout", "_dispatch_call_block_and_release", "_dispatch_continuation_pop",
        "_dispatch_lane_serial_drain", "_dispatch_main_queue_callback_4CF", "__CFRUNLOOP_IS_", "swift_job_run",
        "_dispatch_sync", "_dispatch_barrier_sync", "_dispatch_lane_barrier_sync", "DispatchQueue.sync",
        "DispatchQueue._syncHelper", "DispatchQueue.asyncAndWait",
    ]

    /// True when the stack shows the thread running a Swift concurrency job.
    static func runsSwiftJob(_ frames: [StackFrame]) -> Bool {
        frames.contains { $0.function?.contains("swift_job_run") == true }
    }

    /// Frames of libdispatch's manager thread, which drains internal queues
    /// (timers, event sources) with the same functions as a queue's worker but
    /// never runs a job of the program.
    static let managerMarkers = ["_dispatch_mgr_thread", "_dispatch_mgr_invoke"]

    /// True when the stack shows the thread running a job for a queue or run loop.
    static func runsJob(_ frames: [StackFrame]) -> Bool {
        var job = false
        for frame in frames {
            guard let name = frame.function else { continue }
            if managerMarkers.contains(where: { name.containsText($0) }) { return false }
            if !job && busyMarkers.contains(where: { name.containsText($0) }) { job = true }
        }
        return job
    }
    /// Frames that mean the thread waits for work.
    static let idleMarkers = [
        "_dispatch_worker_thread", "_dispatch_sig_thread", "_dispatch_event_loop_drain", "_dispatch_mgr_thread",
        "__CFRunLoopRun", "__CFRunLoopServiceFileDescriptors",
    ]

    /// Frames that end a complete call chain.
    static let threadRoots = ["start_thread", "clone", "__libc_start", "_start"]

    /// Whether the certain frames reach a thread's root.
    static func reachesRoot(_ frames: [StackFrame]) -> Bool {
        frames.contains { frame in
            guard !frame.isUncertain, let name = frame.function else { return false }
            return threadRoots.contains { name.hasPrefix($0) || name.containsText("_" + $0) }
        }
    }

    /// Keeps the scan's frames only where they can help: when the certain chain
    /// reaches a thread's root, every uncertain frame goes; otherwise only those
    /// beyond the last certain frame stay (the unwinder adds at most
    /// ``StackUnwinder/uncertainLimit``).
    static func prune(_ frames: [StackFrame]) -> [StackFrame] {
        if reachesRoot(frames) { return frames.filter { !$0.isUncertain } }
        guard let lastCertain = frames.lastIndex(where: { !$0.isUncertain }) else {
            return Array(frames.prefix(StackUnwinder.uncertainLimit))
        }
        return Array(
            frames[...lastCertain].filter { !$0.isUncertain }
                + frames[(lastCertain + 1)...].prefix(StackUnwinder.uncertainLimit))
    }

    /// True when the stack shows a thread waiting for work and running none: a
    /// parked dispatch worker, a run loop asleep, or an event loop (SwiftNIO's,
    /// say) parked in `epoll_wait` (`kevent` on Apple platforms).
    static func looksIdle(_ frames: [StackFrame]) -> Bool {
        let names = frames.compactMap(\.function)
        if names.contains(where: { name in busyMarkers.contains { name.containsText($0) } }) { return false }
        return names.contains(where: { name in idleMarkers.contains { name.containsText($0) } })
            || waitsForEvents(frames)
    }

    /// The system calls an event loop parks in.
    static let eventWaitCalls = ["epoll_wait", "epoll_pwait", "kevent"]

    /// True when the innermost named frames (the C library's, up to 4) are an
    /// event-wait system call: the thread sleeps until a descriptor is ready.
    static func waitsForEvents(_ frames: [StackFrame]) -> Bool {
        frames.lazy.compactMap(\.function).prefix(4).contains { name in
            eventWaitCalls.contains { name.contains($0) }
        }
    }
}
