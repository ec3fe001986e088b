import Dispatch
import SafeTimers

/// Detects when a thread or queue stops answering, reports the start and the end of
/// each stall with its measured duration, and shows where the blocked thread was
/// stuck.
///
/// ```swift
/// let detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250))
/// detector.start()
/// Task {
///     for await event in detector.events {
///         print(event)   // phase, duration, and the blocked thread's stack, one frame a line
///     }
/// }
/// // …
/// detector.stop()
/// ```
///
/// ## Targets
/// - ``Target/mainRunLoop``: a run-loop observer times every iteration of the main
///   run loop exactly. Use it when the main thread runs `RunLoop.main` (or
///   `CFRunLoopRun`); under `dispatchMain()` there is no run loop and it sees nothing.
/// - ``Target/mainQueue``: a heartbeat: every `heartbeat` a tiny block is posted to
///   the main queue and the detector notes when it runs. Works with a run loop,
///   `dispatchMain()`, an async `main` and the `MainActor` alike.
/// - ``Target/queue(_:)``: the same heartbeat on any serial queue.
/// - ``Target/custom(name:post:)``: the same heartbeat on any executor (a SwiftNIO
///   `EventLoop`, say): you post the probe, the detector does the rest.
/// - ``Target/cooperativePool``: the same heartbeat as a detached task: a stall is
///   every thread of Swift concurrency's pool blocked.
///
/// ## What is reported
/// A stall is reported once: `.started` as soon as the target has been blocked for
/// `threshold` (so a deadlock is reported too, while it lasts), then `.ended` when
/// it answers again, with the total duration. For a run loop the duration is exact;
/// for a heartbeat its start is known within half a heartbeat (the default heartbeat
/// is a tenth of the threshold, at most 50 ms).
///
/// At `.started` the detector samples the blocked thread's stack (Linux): a
/// thread asleep in the kernel is read from `/proc/self/task/TID/syscall` and
/// `process_vm_readv`, with no signal, so its `sleep`, `read` or lock wait returns
/// exactly as it would without the detector; only a thread seen running gets a
/// `SIGPROF`, sent to it alone, whose C handler copies its registers and stack (a
/// thread that fell asleep between that look and the signal has its sleep cut
/// short with `EINTR`, as under any signal-based profiler). The detector unwinds and symbolicates
/// afterwards, on its own queue, and remembers each symbolicated address. A thread
/// that does not answer the signal within 500 ms yields "stack unavailable: …"
/// instead of a hang. The handler stays installed for the life of the process, idle
/// between samples, and passes other `SIGPROF`s to the handler installed before it.
///
/// ## Cost
/// The detector runs on SafeTimers' engine (`SystemTimerScheduler.shared`) and on
/// threads of its own, never on dispatch workers (a program whose blocked queues hold
/// them all still gets its stalls reported): each is started when there is work (a
/// look, samples, an `onEvent` call, a `.custom` target's `post`, a fatal report
/// write) and ends after 2 s without any, or at ``stop()``. The stop witness, one
/// thread shared by every detector of the process, runs while a detector does.
/// Detectors with the same heartbeat share one timer: each firing posts every
/// target's probe. While the target answers, a heartbeat costs its share of that
/// firing and one tiny block on the target; no look is armed, and the detector's
/// threads run only when an answer is overdue (a `.custom` or `.cooperativePool`
/// target's `post` thread hands over every probe).
///
/// ## False positives it suppresses
/// - **Stopped process** (`SIGSTOP`, a debugger's breakpoint): a witness thread
///   asleep in `epoll_wait` learns of each `SIGCONT` (Linux fails the call with
///   `EINTR` after a stop, without any signal handler); an answer owed across a stop
///   is owed afresh from the detector's first look after it, whatever the load, and
///   a stall in progress loses the stopped time.
/// - **Machine asleep**: durations use the monotonic clock, which does not advance
///   while the machine sleeps.
/// - **Debugger attached** (`TracerPid` in `/proc/self/status`): stalls that start
///   while a debugger is attached are not reported, unless `reportsWhileDebugged`.
///
/// Thread safety: every member may be used from any thread. Several detectors may
/// run at once; stack samples are taken one at a time.
public final class StallDetector: Sendable {
    /// What a detector watches.
    public enum Target: Sendable, CustomStringConvertible {
        /// The main thread's run loop, timed by a run-loop observer.
        case mainRunLoop
        /// The main dispatch queue, by heartbeat.
        case mainQueue
        /// Any serial dispatch queue, by heartbeat.
        case queue(DispatchQueue)
        /// Any executor, by heartbeat: every heartbeat the detector hands `post` a
        /// probe, a tiny closure that `post` must arrange to run on the executor (a
        /// SwiftNIO `EventLoop`, an actor's executor, a thread of your own). A stall
        /// is a probe that has not run for `threshold`; the report samples the
        /// thread that last ran a probe. If that thread is waiting for work when
        /// the stall is detected (a dispatch queue's jobs move between worker
        /// threads), the first thread seen running a dispatch job is sampled
        /// instead; before any probe has run, the stack is "unavailable".
        ///
        /// ```swift
        /// // One detector per SwiftNIO event loop:
        /// let detector = StallDetector(
        ///     target: .custom(name: "event loop 0") { probe in eventLoop.execute(probe) },
        ///     threshold: .milliseconds(100))
        /// detector.start()
        /// ```
        ///
        /// `post` is called on a thread of the detector's own, never while the
        /// detector holds a lock, with at most one probe outstanding. What `post`
        /// does with the probe cannot hurt the detector:
        /// - run it later on the executor: the intended use;
        /// - run it at once, inside `post`: the probe answers at once (an executor
        ///   that runs work inline is never blocked);
        /// - run it more than once: only the first run counts;
        /// - drop it (release it without running it, as a shut-down event loop
        ///   does): the next heartbeat posts a new one; an executor that runs none
        ///   for `threshold` is reported as stalled;
        /// - keep it without running it: counts as a stall, as a blocked executor
        ///   would; a probe run after ``StallDetector/stop()`` does nothing and holds
        ///   the detector only weakly;
        /// - block inside `post`: the detection runs elsewhere, so the stall is
        ///   reported all the same; no further probe is posted until `post` returns.
        ///   Each detector calls `post` on a thread of its own, so a `post` that
        ///   never returns holds that thread for good, and no other detector's.
        ///
        /// A `post` call already under way when ``StallDetector/stop()`` is called
        /// (the detector decided to make it before the stop) may still post one
        /// probe; it does nothing when it runs. No call begins after that.
        ///
        /// - Parameters:
        ///   - name: What the reports call the target (``StallEvent/target``).
        ///   - post: Hands the probe to the executor.
        case custom(name: String, post: @Sendable (_ probe: @escaping @Sendable () -> Void) -> Void)
        /// Swift concurrency's global executor: a stall is new work that waits
        /// longer than `threshold` to start because every thread of the pool is
        /// blocked (a synchronous wait, a lock, a long computation inside a task).
        ///
        /// ```swift
        /// let detector = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
        /// detector.start()
        /// ```
        ///
        /// Every heartbeat the detector starts a tiny detached task of medium
        /// priority (the default) and notes when it runs. At `.started` every thread
        /// of the pool running a Swift job is sampled: ``StallEvent/poolBacktraces``
        /// holds them all (the blocked threads are the culprits) and
        /// ``StallEvent/backtrace`` is the first. On Linux the medium-priority pool's
        /// threads are the default-QoS global queue's, so a `DispatchQueue.global()`
        /// block that blocks holds the pool as a task does: such blocks are sampled
        /// too, after the Swift jobs. A pool busy with short tasks is not stalled: the probe runs
        /// between them. A backlog of queued tasks longer than `threshold` delays new
        /// work just as much, and is reported.
        ///
        /// On Linux each task priority has its own pool of as many threads as there
        /// are cores: the probe watches the medium-priority pool, which runs `Task {}`
        /// started outside any task, `Task.detached {}` and async `main`. The main
        /// thread is never sampled as a pool thread.
        ///
        /// Read this detector's ``StallDetector/events`` from outside the pool (a
        /// `Thread`, or a task on a task executor of its own): a task of the blocked
        /// pool gets the `.started` event only once the pool frees up. Pair it with
        /// `fatalReportPath:`, which is written from the detector's own queue and so
        /// survives a pool that never recovers.
        case cooperativePool

        /// "main run loop", "main queue", "queue '<label>'", or a custom target's
        /// name.
        public var description: String {
            switch self {
            case .mainRunLoop: "main run loop"
            case .mainQueue: "main queue"
            case .queue(let queue): "queue '\(queue.label)'"
            case .custom(let name, _): name
            case .cooperativePool: "cooperative pool"
            }
        }
    }

    /// The stall events: `.started` and `.ended` for each stall. The stream ends at
    /// ``stop()``; a stall going on then (one whose `.started` was yielded) ends
    /// first, with an `.ended` event marked ``StallEvent/endedByStop``. Iterate it
    /// from one task; the newest 100 events are kept for a slow reader.
    public let events: AsyncStream<StallEvent>

    private let core: DetectorCore

    /// Creates a detector; nothing runs until ``start()``.
    ///
    /// - Parameters:
    ///   - target: What to watch.
    ///   - threshold: How long the target must be blocked to count as stalled.
    ///     Values below 10 ms are raised to 10 ms; values above
    ///     ``longestThreshold`` (any magnitude) are reduced to it.
    ///   - heartbeat: How often a heartbeat target is probed (and how often the
    ///     detector looks at the clock). Default: a tenth of the threshold, between
    ///     5 ms and 50 ms.
    ///   - idleHeartbeat: The widest spacing of probes while the target answers
    ///     them promptly, for a lower idle cost: after every four prompt
    ///     answers in a row (each within a quarter of a heartbeat) the spacing
    ///     doubles, up to this; the first answer that is not prompt, and a probe
    ///     unanswered for a heartbeat, bring it back to `heartbeat` at once.
    ///     Rounded down to a whole number of heartbeats, at least `heartbeat` and
    ///     at most half the threshold (or `heartbeat`, when that is longer). A
    ///     stall that begins while the spacing is wide is seen only at the next
    ///     probe: it is reported up to
    ///     `idleHeartbeat − heartbeat` later than with the plain heartbeat, and
    ///     counted from half a heartbeat before that probe, so measured short
    ///     by up to that much; no block is measured longer than with a probe
    ///     every beat, and one shorter than `threshold − heartbeat` is still
    ///     never reported. Every block of `threshold + idleHeartbeat` or longer
    ///     is reported. Default: nil, a probe every heartbeat. See
    ///     <doc:RunningInProduction> for what it saves.
    ///   - reportsWhileDebugged: Report stalls that start while a debugger is
    ///     attached. Default: false.
    ///   - fatalReportPath: Where to keep the report of a stall in progress, so that
    ///     a stall the process does not survive (killed by a watchdog or a user) is
    ///     known on the next run: ``takeFatalStallReport(at:)``. Written atomically
    ///     at `.started`, rewritten about every 250 ms while the stall lasts, removed
    ///     at `.ended` and at ``stop()``. Default: nil, no file.
    ///   - onEvent: Called with every event as it happens, beside ``events``: in
    ///     order, one at a time, on a serial queue of the detector's own, never on
    ///     the watched target's thread or executor (so a `.started` event arrives
    ///     while the target is still blocked, which a task reading ``events`` on a
    ///     stalled executor could not do). A slow handler delays only the events
    ///     after it. Once ``stop()`` has returned the handler is not running and is
    ///     not called again (``stop()`` waits for a call in progress, unless called
    ///     from this detector's handler, and drops calls not begun, except an
    ///     `.ended` event whose `.started` the handler was called with: the stream
    ///     still yields those events). So a handler that was told a stall started
    ///     is told it ended, also when ``stop()`` cuts it short
    ///     (``StallEvent/endedByStop``), unless ``stop()`` is called from this
    ///     detector's handler. Called from another detector's handler,
    ///     ``stop()`` waits for this handler like any caller, so two handlers that
    ///     stop each other's detectors can wait for each other. Default: nil.
    public convenience init(
        target: Target,
        threshold: Duration = .milliseconds(250),
        heartbeat: Duration? = nil,
        idleHeartbeat: Duration? = nil,
        reportsWhileDebugged: Bool = false,
        fatalReportPath: String? = nil,
        onEvent: (@Sendable (StallEvent) -> Void)? = nil
    ) {
        self.init(
            target: target, threshold: threshold, heartbeat: heartbeat, idleHeartbeat: idleHeartbeat,
            reportsWhileDebugged: reportsWhileDebugged, fatalReportPath: fatalReportPath, onEvent: onEvent,
            isTraced: ProcessFacts.isTraced)
    }

    /// The longest threshold in effect (about 100 years); longer ones, up to any
    /// magnitude, are reduced to it. (A year's seconds times 100: the product of
    /// the literals alone, 3,153,600,000, does not fit the 32-bit `Int` of watchOS.)
    public static let longestThreshold = Duration.seconds(365 * 86_400) * 100

    /// The designated initializer; tests inject `isTraced`.
    init(
        target: Target,
        threshold: Duration,
        heartbeat: Duration?,
        idleHeartbeat: Duration? = nil,
        reportsWhileDebugged: Bool,
        fatalReportPath: String? = nil,
        onEvent: (@Sendable (StallEvent) -> Void)? = nil,
        isTraced: @escaping @Sendable () -> Bool
    ) {
        let (stream, continuation) = AsyncStream.makeStream(
            of: StallEvent.self, bufferingPolicy: .bufferingNewest(100))
        events = stream
        // A threshold too long to matter counts as a century, which keeps every
        // sum of instants and thresholds far from overflowing: such a detector
        // never reports, whatever the magnitude it was given.
        let threshold = min(max(threshold, .milliseconds(10)), Self.longestThreshold)
        let heartbeat =
            heartbeat.map { min(max($0, .milliseconds(1)), threshold) }
            ?? min(max(threshold / 10, .milliseconds(5)), .milliseconds(50))
        let idleHeartbeat = idleHeartbeat.map { min(max($0, heartbeat), threshold / 2) }
        core = DetectorCore(
            target: target, threshold: threshold, heartbeat: heartbeat, idleHeartbeat: idleHeartbeat,
            reportsWhileDebugged: reportsWhileDebugged, isTraced: isTraced, fatalReportPath: fatalReportPath,
            outlet: StallEventOutlet(continuation: continuation, handler: onEvent))
    }

    deinit {
        core.stop()
    }

    /// Starts watching. Idempotent; a stopped detector does not start again.
    public func start() { core.start() }

    /// Stops watching and ends ``events``. Idempotent. When it returns, the
    /// detector's timers are cancelled (no probe is posted and no sample taken
    /// afterwards), its run-loop observer is removed and its fatal report file,
    /// if any, is deleted; the detector's own threads end as soon as they have
    /// nothing left to do (called from the `onEvent` handler, its thread ends
    /// after that call).
    ///
    /// A stall reported `.started` and still going on is ended by the stop: an
    /// `.ended` event marked ``StallEvent/endedByStop``, its duration the time
    /// the target had been blocked until the stop, is the last event of
    /// ``events``, and the `onEvent` handler is called with it before this
    /// returns (unless this is called from that handler). A stall that ended
    /// just before the stop (its target answered) gets its own `.ended`, also
    /// before this returns. A stall not reported yet (being sampled) ends with
    /// nothing, as it began with nothing.
    ///
    /// It waits for a look or a sample under way and for the handler's call
    /// under way: usually under a millisecond; measured up to about 100 ms in
    /// release with 64 detectors sampling stalls at once, and about 200 ms
    /// during a process's first stall sample (its names read for the first
    /// time). Called from several
    /// threads at once, every call returns after that last event; called from
    /// the handler while another call waits for it, it returns at once.
    public func stop() { core.stop() }

    /// What this detector watches; its `description` is the ``StallEvent/target``
    /// of the events it reports.
    public var target: Target { core.watchedTarget }

    /// The threshold in effect.
    public var threshold: Duration { core.threshold }

    /// The heartbeat in effect.
    public var heartbeat: Duration { core.heartbeat }

    /// The widest spacing of probes in effect (a whole number of heartbeats):
    /// ``heartbeat`` when the detector was made without an `idleHeartbeat`, or
    /// for the main run loop (an observer, no probes).
    public var idleHeartbeat: Duration { core.idleHeartbeat }

    /// The lags of the target's probes since the detector was created or its lag
    /// was last reset (see ``LagSnapshot``); with `reset`, a new window begins at
    /// once, so no probe is counted twice or missed between two snapshots taken
    /// with `reset`. Recording costs each probe's answer a few integer
    /// operations under the lock it already takes.
    ///
    /// A detector that is not running records nothing: its snapshot keeps what
    /// it had.
    public func lagSnapshot(reset: Bool = false) -> LagSnapshot { core.lagSnapshot(reset: reset) }

    /// Begins a new lag window: forgets the lags recorded so far.
    public func resetLag() { _ = core.lagSnapshot(reset: true) }

    /// Whether no stall is being sampled, none goes on, and no answer has been
    /// owed for the threshold: a ``stop()`` now loses no stall (for
    /// `StallDetectionTesting`, which stops a detector when a test ends).
    package var isSettled: Bool { core.settlement() == .settled }

    /// Whether a stall's `.started` is being sampled (a ``stop()`` now would end
    /// it with nothing).
    package var isSampling: Bool { core.settlement() == .sampling }

    /// Waits until the `onEvent` handler has been called with every event
    /// concluded so far, those still to be published on the detector's thread
    /// too (without waiting for the handler when called from it, or without one).
    package func waitForHandler() { core.waitForHandler() }
}
