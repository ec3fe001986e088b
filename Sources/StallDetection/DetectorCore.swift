import CStallCapture
import Dispatch
@_spi(SafeTimersInternal) import SafeTimers

#if canImport(CoreFoundation)
import CoreFoundation
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The engine of a ``StallDetector``: one thread that probes the target, keeps a
/// ``StallTracker``, samples the blocked thread and emits events.
///
/// Threads: the detector thread owns the tracker, the sampler and the
/// symbolicator; probes (on the target queue) and the run-loop observer (on the
/// main thread) only drop facts into `mailbox`.
final class DetectorCore: Sendable {
    let threshold: Duration
    let heartbeat: Duration
    private let target: StallDetector.Target
    private let reportsWhileDebugged: Bool
    /// Whether a debugger is attached; `/proc/self/status` unless a test injects one.
    private let isTraced: @Sendable () -> Bool
    private let continuation: AsyncStream<StallEvent>.Continuation
    private let thresholdTicks: Int64
    private let heartbeatTicks: Int64

    private struct Mailbox {
        enum Lifecycle { case idle, running, stopped }
        var lifecycle = Lifecycle.idle
        var stopRequested = false
        /// Heartbeat answers: when the probe was posted, when it ran, and where.
        var answers: [(sent: Int64, ran: Int64, thread: Int32)] = []
        var probeOutstanding = false
        /// Run-loop activity since the detector last looked: the first and the last.
        var firstActivity: (time: Int64, idle: Bool)?
        var lastActivity: (time: Int64, idle: Bool)?
        /// A stall is in progress: wake the detector as soon as the target answers.
        var wantsPromptWake = false
        var observer: RunLoopObserverHandle?
        var thread: NamedThread?
    }

    private let mailbox = StateLock(Mailbox())
    private let wake = ConditionLock()

    init(
        target: StallDetector.Target, threshold: Duration, heartbeat: Duration, reportsWhileDebugged: Bool,
        isTraced: @escaping @Sendable () -> Bool = ProcessFacts.isTraced,
        continuation: AsyncStream<StallEvent>.Continuation
    ) {
        self.isTraced = isTraced
        self.target = target
        self.threshold = threshold
        self.heartbeat = heartbeat
        self.reportsWhileDebugged = reportsWhileDebugged
        self.continuation = continuation
        self.thresholdTicks = Self.ticks(threshold)
        self.heartbeatTicks = max(1_000_000, Self.ticks(heartbeat))
    }

    // MARK: Lifecycle

    func start() {
        let begin = mailbox.withLock { mailbox -> Bool in
            guard mailbox.lifecycle == .idle else { return false }
            mailbox.lifecycle = .running
            return true
        }
        guard begin else { return }
        var observer: RunLoopObserverHandle?
        if case .mainRunLoop = target {
            observer = RunLoopObserverHandle(onActivity: { [weak self] time, idle in
                self?.record(activityAt: time, idle: idle)
            })
        }
        // Under the lock, so that a concurrent stop() either finds the observer
        // and the thread to remove and join, or has already stopped everything.
        let started = mailbox.withLock { mailbox -> Bool in
            guard !mailbox.stopRequested, mailbox.lifecycle == .running else { return false }
            mailbox.observer = observer
            mailbox.thread = NamedThread.start(name: "StallDetector") { [self] in self.run() }
            return true
        }
        if !started { observer?.remove() }
    }

    func stop() {
        let (observer, thread) = mailbox.withLock { mailbox -> (RunLoopObserverHandle?, NamedThread?) in
            guard mailbox.lifecycle == .running else {
                mailbox.lifecycle = .stopped
                mailbox.stopRequested = true
                return (nil, nil)
            }
            mailbox.lifecycle = .stopped
            mailbox.stopRequested = true
            defer {
                mailbox.observer = nil
                mailbox.thread = nil
            }
            return (mailbox.observer, mailbox.thread)
        }
        observer?.remove()
        wake.withLock { wake.signal() }
        thread?.join()
        continuation.finish()
    }

    // MARK: Facts from the target

    private func record(answerSentAt sent: Int64, ranAt ran: Int64, thread: Int32) {
        let prompt = mailbox.withLock { mailbox in
            mailbox.answers.append((sent, ran, thread))
            mailbox.probeOutstanding = false
            return mailbox.wantsPromptWake
        }
        if prompt { wake.withLock { wake.signal() } }
    }

    private func record(activityAt time: Int64, idle: Bool) {
        let prompt = mailbox.withLock { mailbox in
            if mailbox.firstActivity == nil { mailbox.firstActivity = (time, idle) }
            mailbox.lastActivity = (time, idle)
            return mailbox.wantsPromptWake
        }
        if prompt { wake.withLock { wake.signal() } }
    }

    private func postProbe(sentAt sent: Int64) {
        let queue: DispatchQueue
        switch target {
        case .mainRunLoop: return
        case .mainQueue: queue = .main
        case .queue(let watched): queue = watched
        }
        queue.async { [weak self] in
            self?.record(answerSentAt: sent, ranAt: MonotonicClock.nanoseconds(), thread: stallcapture_current_tid())
        }
    }

    // MARK: The detector thread

    private struct OpenStall {
        var id: UInt64
        var samples: [Int32: StallBacktrace]
        var reported: StallBacktrace
        var suppressed: Bool
        var sampling: Int64 = 0
    }

    private func run() {
        let installError = StackSampler.install()
        let sampler = StackSampler(timeout: .milliseconds(100))
        let symbolicator = Symbolicator()
        symbolicator.warmUp()
        var tracker = StallTracker(threshold: thresholdTicks, now: MonotonicClock.nanoseconds())
        var open: OpenStall?
        var lastAnsweringThread: Int32?
        var nextTick = MonotonicClock.nanoseconds() + heartbeatTicks

        while true {
            // Sleep until the next tick, a prompt answer, or stop.
            wake.lock()
            while true {
                let (stop, hasNews) = mailbox.withLock {
                    ($0.stopRequested, $0.wantsPromptWake && (!$0.answers.isEmpty || $0.firstActivity != nil))
                }
                if stop || hasNews || MonotonicClock.nanoseconds() >= nextTick { break }
                wake.wait(untilMonotonic: nextTick)
            }
            wake.unlock()

            let now = MonotonicClock.nanoseconds()
            var (stop, answers, first, last, outstanding) = mailbox.withLock { mailbox in
                defer {
                    mailbox.answers.removeAll()
                    mailbox.firstActivity = nil
                    mailbox.lastActivity = nil
                }
                return (
                    mailbox.stopRequested, mailbox.answers, mailbox.firstActivity, mailbox.lastActivity,
                    mailbox.probeOutstanding
                )
            }
            if stop { break }

            // 1. What the target did since the last look ends any open stall.
            var progress: [(time: Int64, idle: Bool, thread: Int32?)] = answers.map { ($0.ran, false, $0.thread) }
            if let first { progress.append((first.time, first.idle, nil)) }
            if let last, last.time != first?.time { progress.append((last.time, last.idle, nil)) }
            for fact in progress.sorted(by: { $0.time < $1.time }) {
                if let thread = fact.thread { lastAnsweringThread = thread }
                let event: StallTracker.Event?
                if case .mainRunLoop = target {
                    event =
                        fact.idle ? tracker.idle(at: fact.time) : tracker.progress(at: fact.time, busyAfterwards: true)
                } else {
                    event = tracker.progress(at: fact.time)
                }
                if case .ended(let id, let duration) = event, let stall = open, stall.id == id {
                    open = nil
                    if !stall.suppressed {
                        let confirmed = fact.thread.flatMap { stall.samples[$0] } ?? stall.reported
                        emit(id: id, phase: .ended, duration: duration, backtrace: confirmed, sampling: stall.sampling)
                    }
                }
            }

            // 2. A late wake-up means the process (or machine) did not run: take the gap out.
            let lateness = now - nextTick
            if lateness > max(4 * heartbeatTicks, 100_000_000) {
                tracker.discontinuity(gap: lateness)
            }

            // 3. Probe again if the last probe was answered.
            if case .mainRunLoop = target {
            } else if !outstanding {
                outstanding = true
                mailbox.withLock { $0.probeOutstanding = true }
                tracker.probeSent(at: now)
                postProbe(sentAt: now)
            }

            // 4. Has the target owed an answer for too long?
            if case .started(let id, let duration) = tracker.tick(now: now) {
                let suppressed = !reportsWhileDebugged && isTraced()
                var stall = OpenStall(
                    id: id, samples: [:], reported: .unavailable("not sampled"), suppressed: suppressed)
                if !suppressed {
                    if let installError {
                        stall.reported = .unavailable(installError)
                    } else {
                        (stall.reported, stall.samples) = sampleBlockedThread(
                            sampler: sampler, symbolicator: symbolicator, lastAnswering: lastAnsweringThread)
                    }
                    let sampling = MonotonicClock.nanoseconds() - now
                    stall.sampling = sampling
                    emit(id: id, phase: .started, duration: duration, backtrace: stall.reported, sampling: sampling)
                }
                open = stall
            }
            mailbox.withLock { $0.wantsPromptWake = open != nil }

            nextTick += heartbeatTicks
            let after = MonotonicClock.nanoseconds()
            if nextTick <= after { nextTick = after + heartbeatTicks }
        }
    }

    private func emit(
        id: UInt64, phase: StallEvent.Phase, duration: Int64, backtrace: StallBacktrace, sampling: Int64
    ) {
        continuation.yield(
            StallEvent(
                id: id, phase: phase, duration: .nanoseconds(duration), threshold: threshold,
                target: target.description, backtrace: backtrace, samplingTime: .nanoseconds(sampling)))
    }

    // MARK: Which thread is blocked

    /// Samples the thread that is most likely blocked: the main thread for the
    /// main run loop; otherwise the candidates in order (the main thread for the
    /// main queue, the thread that answered the last probe, then every other
    /// thread), skipping samples that show an idle worker. Returns the chosen
    /// backtrace and every sample taken (keyed by thread), so the `.ended` event
    /// can use the one of the thread that finally answered.
    private func sampleBlockedThread(
        sampler: StackSampler, symbolicator: Symbolicator, lastAnswering: Int32?
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
        if candidates.count > 1 || target.usesHeartbeat {
            let own = stallcapture_current_tid()
            for (id, name) in ProcessFacts.threads()
            where id != own && !candidates.contains(id) && !Self.ignoredThreadNames.contains(name) {
                candidates.append(id)
            }
        }
        var samples: [Int32: StallBacktrace] = [:]
        var firstFailure: StallBacktrace?
        var firstIdle: StallBacktrace?
        for thread in candidates.prefix(48) {
            switch sampler.capture(thread: thread, isTextAddress: symbolicator.isTextAddress) {
            case .unavailable(let reason):
                if firstFailure == nil { firstFailure = .unavailable(reason, threadID: thread) }
            case .frames(let raw):
                let backtrace = StallBacktrace(
                    frames: StackShape.prune(symbolicator.symbolicate(raw)), threadID: thread, unavailableReason: nil)
                samples[thread] = backtrace
                if candidates.count == 1 || !StackShape.looksIdle(backtrace.frames) {
                    return (backtrace, samples)
                }
                if firstIdle == nil { firstIdle = backtrace }
            }
        }
        return (firstIdle ?? firstFailure ?? .unavailable("no thread to sample"), samples)
    }

    /// Threads that are never the blocked one: detectors and SafeTimers' scheduler.
    private static let ignoredThreadNames: Set<String> = ["StallDetector", "SafeTimers"]

    private static func ticks(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

extension StallDetector.Target {
    var usesHeartbeat: Bool {
        if case .mainRunLoop = self { return false }
        return true
    }
}

/// Reading a sampled stack: is the thread running a job, or waiting for one?
enum StackShape {
    /// Frames that mean the thread runs somebody's code for a queue or run loop.
    static let busyMarkers = [
        "_dispatch_client_callout", "_dispatch_call_block_and_release", "_dispatch_continuation_pop",
        "_dispatch_lane_serial_drain", "_dispatch_main_queue_callback_4CF", "__CFRUNLOOP_IS_", "swift_job_run",
    ]
    /// Frames that mean the thread waits for work.
    static let idleMarkers = [
        "_dispatch_worker_thread", "_dispatch_sig_thread", "_dispatch_event_loop_drain", "_dispatch_mgr_thread",
        "__CFRunLoopRun", "__CFRunLoopServiceFileDescriptors",
    ]

    /// Frames that end a complete call chain.
    static let threadRoots = ["start_thread", "clone", "__libc_start", "_start"]

    /// The most frames the scan may add where the chain broke off.
    static let uncertainLimit = 24

    /// Keeps the scan's frames only where they can help: when the certain chain
    /// (unwinder and frame pointers) reaches a thread's root, the scan only found
    /// stale words, and all its frames go; otherwise its frames beyond the last
    /// certain frame stay (at most ``uncertainLimit``), and those interleaved with
    /// certain frames go.
    static func prune(_ frames: [StackFrame]) -> [StackFrame] {
        let certain = frames.filter { !$0.isUncertain }
        let complete = certain.contains { frame in
            guard let name = frame.function else { return false }
            return threadRoots.contains { name.hasPrefix($0) || name.contains("_" + $0) }
        }
        if complete { return certain }
        guard let lastCertain = frames.lastIndex(where: { !$0.isUncertain }) else {
            return Array(frames.prefix(uncertainLimit))
        }
        return Array(
            frames[...lastCertain].filter { !$0.isUncertain } + frames[(lastCertain + 1)...].prefix(uncertainLimit))
    }

    /// True when the stack shows a thread waiting for work and running none.
    static func looksIdle(_ frames: [StackFrame]) -> Bool {
        let names = frames.compactMap(\.function)
        if names.contains(where: { name in busyMarkers.contains { name.contains($0) } }) { return false }
        return names.contains(where: { name in idleMarkers.contains { name.contains($0) } })
    }
}
