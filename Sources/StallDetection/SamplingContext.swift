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

    /// Installs the signal handler and loads symbols before the first stall.
    func warmUp() {
        _ = prepared()
        symbolicator?.warmUp()
    }

    private func prepared() -> (StackSampler, Symbolicator) {
        if let sampler, let symbolicator { return (sampler, symbolicator) }
        installError = StackSampler.install()
        let made = (StackSampler(timeout: .milliseconds(100)), Symbolicator())
        (sampler, symbolicator) = made
        return made
    }

    /// Samples one thread and names its frames.
    func backtrace(of thread: Int32) -> StallBacktrace {
        let (sampler, symbolicator) = prepared()
        switch sampler.capture(thread: thread) {
        case .unavailable(let reason):
            return .unavailable(reason, threadID: UInt64(UInt32(bitPattern: thread)))
        case .copied(let copy, let signalled):
            if signalled, let installError {
                return .unavailable(installError, threadID: UInt64(UInt32(bitPattern: thread)))
            }
            let unwinder = StackUnwinder(
                copy: copy, isText: symbolicator.isTextAddress,
                readWord: { address in
                    var value: UInt = 0
                    let copied = withUnsafeMutableBytes(of: &value) { StackSampler.copyMemory(from: address, into: $0) }
                    return copied == 1 ? value : nil
                },
                exactStart: { candidate, inner, innerIsReturnAddress in
                    // Both in the main executable, whose symbol table is complete; a
                    // call into a library may reach its target through a tail call
                    // (`qsort` to `qsort_r`).
                    guard symbolicator.isInExecutable(candidate), symbolicator.isInExecutable(inner) else {
                        return nil
                    }
                    return symbolicator.functionStart(of: inner, isReturnAddress: innerIsReturnAddress)
                })
            let frames = StackShape.prune(symbolicator.symbolicate(unwinder.unwind()))
            return StallBacktrace(
                frames: frames, threadID: UInt64(UInt32(bitPattern: thread)), unavailableReason: nil,
                isTruncated: copy.truncated && !StackShape.reachesRoot(frames))
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
    func sampleBlockedThread(
        target: StallDetector.Target, lastAnswering: Int32?
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
        if target.usesHeartbeat {
            // No likely thread runs a job: every other thread, once.
            let own = stallcapture_current_tid()
            let others = ProcessFacts.threads().filter { id, name in
                id != own && !candidates.contains(id) && !Self.ignoredThreadNames.contains(name)
            }.map(\.id)
            if let found = sample(Array(others.prefix(48)), alone: false) { return (found, samples) }
        }
        return (firstOther ?? firstIdle ?? firstFailure ?? .unavailable("no thread to sample"), samples)
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
        for thread in others.prefix(48) {
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
        let threads = ProcessFacts.threads().filter { id, name in
            id != own && !Self.ignoredThreadNames.contains(name)
        }.map(\.id)
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

    /// True when the stack shows the thread running a job for a queue or run loop.
    static func runsJob(_ frames: [StackFrame]) -> Bool {
        frames.contains { frame in
            guard let name = frame.function else { return false }
            return busyMarkers.contains { name.contains($0) }
        }
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
            return threadRoots.contains { name.hasPrefix($0) || name.contains("_" + $0) }
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
        if names.contains(where: { name in busyMarkers.contains { name.contains($0) } }) { return false }
        return names.contains(where: { name in idleMarkers.contains { name.contains($0) } })
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
