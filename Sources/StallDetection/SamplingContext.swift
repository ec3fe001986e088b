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

    /// CPU nanoseconds spent so far naming addresses seen for the first time.
    var namingCost: Int64 { symbolicator?.namingCost ?? 0 }

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
    /// main run loop; otherwise the first thread seen running a job for a queue or
    /// run loop, among the candidates in order (the main thread for the main queue,
    /// the thread that answered the last probe, then every other thread); failing
    /// that, the first thread that is neither idle nor unreadable. Returns the chosen
    /// backtrace and every sample taken (keyed by thread), so the `.ended` event
    /// can use the one of the thread that finally answered.
    ///
    /// With `candidatesOnly`, the other threads are not tried (the profile's
    /// samples before the threshold, which must not hold up the detector's looks).
    func sampleBlockedThread(
        target: StallDetector.Target, lastAnswering: Int32?, candidatesOnly: Bool = false
    ) -> (StallBacktrace, [Int32: StallBacktrace]) {
        let mainThread = ProcessFacts.mainThreadID
        var candidates: [Int32] = []
        switch target {
        case .mainRunLoop:
            candidates = [mainThread]
        case .mainQueue:
            candidates = [mainThread] + (lastAnswering.map { [$0] } ?? [])
        case .queue:
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
                if StackShape.looksIdle(backtrace.frames) {
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
            if let found = sample(Array(others.prefix(48)), alone: false) { return (found, samples) }
        }
        return (firstOther ?? firstIdle ?? firstFailure ?? .unavailable("no thread to sample"), samples)
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

    /// True when the stack shows a thread waiting for work and running none.
    static func looksIdle(_ frames: [StackFrame]) -> Bool {
        let names = frames.compactMap(\.function)
        if names.contains(where: { name in busyMarkers.contains { name.containsText($0) } }) { return false }
        return names.contains(where: { name in idleMarkers.contains { name.containsText($0) } })
    }
}
