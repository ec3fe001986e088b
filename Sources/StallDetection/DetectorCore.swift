import CStallCapture
import Dispatch
import SafeTimers

/// The engine of a ``StallDetector``. It owns no thread: it runs on SafeTimers'
/// engine and on one private serial queue.
///
/// - Heartbeat targets: a `RepeatingTimer` whose handler is the probe: it runs *on*
///   the target queue, so the engine's firing is the post, and with
///   `MissedTickPolicy.skip` no new probe is posted while one is still queued or
///   running (a blocked target gets one probe, not a pile). Each answer moves one
///   `DelayedWork` (the overdue look) back to the moment the next probe would be
///   overdue. With nothing stalled, the detector costs one timer firing and one
///   tiny block per heartbeat: the engine re-arms the repeating timer itself, and
///   a moved entry is never the engine's earliest (the next probe is earlier), so
///   it costs no wake-up. (A `Watchdog` kick would re-arm lazily: a wake-up at
///   each old deadline, four a second at the default threshold.)
/// - Posted probes (`.custom`, `.cooperativePool`): the timer's handler runs on a
///   private post queue and hands the user's `post` (or `Task.detached`) a
///   ``CustomProbe`` in a block of its own, at most one outstanding; the probe
///   answers when it runs and frees the slot when it runs or is released unrun.
///   `post` is never called under the lock nor inside the timer's handler (whose
///   cancel waits for it), so a blocking `post` cannot block `stop()`.
/// - The main run loop: a run-loop observer records each activity and moves the
///   overdue look while the loop is busy.
/// - When the overdue look runs, the detector's queue asks ``StopWitness`` whether the
///   process was stopped meanwhile, asks the ``StallTracker`` whether the target is
///   stalled, and if so samples the blocked thread and emits `.started`. The answer
///   that finally comes emits `.ended`.
///
/// Every decision is made under `state`'s lock with the time it concerns; sampling,
/// symbolication, timers' `deinit`s and event delivery happen after the lock is
/// released.
final class DetectorCore: Sendable {
    let threshold: Duration
    let heartbeat: Duration
    private let target: StallDetector.Target
    private let reportsWhileDebugged: Bool
    /// Whether a debugger is attached; `/proc/self/status` unless a test injects one.
    private let isTraced: @Sendable () -> Bool
    private let continuation: AsyncStream<StallEvent>.Continuation
    private let scheduler: any TimerScheduler
    private let thresholdTicks: Int64
    private let heartbeatTicks: Int64
    /// Where sampling and symbolication run; never the target.
    private let detectorQueue: DispatchQueue
    /// Where a custom target's `post` is called: not the detector queue, so that a
    /// `post` that blocks cannot delay the detection of the stall it causes.
    private let postQueue: DispatchQueue
    private let sampling: SamplingContext
    /// Samples the blocked thread while a stall lasts; keeps the fatal report.
    let profiler: StallProfiler

    private struct State {
        enum Lifecycle { case idle, running, stopped }
        var lifecycle = Lifecycle.idle
        var tracker: StallTracker
        /// The probe timer (heartbeat targets) and the start of its grid.
        var probe: RepeatingTimer?
        var probeGridStart: Int64 = 0
        /// The deadline at which the target is overdue; `overdueGeneration` tells a
        /// current firing from a stale one.
        var overdue: DelayedWork?
        var overdueGeneration: UInt64 = 0
        var overdueTimeout: Int64 = 0
        var observer: RunLoopObserverHandle?
        var lastAnsweringThread: Int32?
        /// The serial queue the last probe ran on (the watched queue's address).
        var lastAnsweringQueue: UInt?
        /// A custom target's probe was posted and has neither run nor been released.
        var postedProbeOutstanding = false
        /// The last moments the detector saw the process run (answers, firings).
        var lastObservation: Int64
        var lastContinueSeen: Int64 = 0
        var open: OpenStall?
    }

    private struct OpenStall {
        enum Phase {
            /// `.started` is being sampled.
            case sampling
            /// The first sample found no thread running a job for the target (every
            /// thread idle or elsewhere): the target may just not have had the CPU
            /// yet. The next look, a heartbeat later, reports it if it still owes.
            case awaitingConfirmation
            /// `.started` was emitted.
            case reported
        }

        var id: UInt64
        var samples: [Int32: StallBacktrace] = [:]
        var reported: StallBacktrace = .unavailable("not sampled yet")
        var suppressed: Bool
        var sampling: Int64 = 0
        /// `.ended` arrived while `.started` was still being sampled.
        var endedWhileSampling: (duration: Int64, thread: Int32?)?
        var phase = Phase.sampling
    }

    private let state: Locked<State>

    init(
        target: StallDetector.Target, threshold: Duration, heartbeat: Duration, reportsWhileDebugged: Bool,
        isTraced: @escaping @Sendable () -> Bool = ProcessFacts.isTraced,
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        fatalReportPath: String? = nil,
        continuation: AsyncStream<StallEvent>.Continuation
    ) {
        self.isTraced = isTraced
        self.target = target
        self.threshold = threshold
        self.heartbeat = heartbeat
        self.reportsWhileDebugged = reportsWhileDebugged
        self.continuation = continuation
        self.scheduler = scheduler
        self.thresholdTicks = Monotonic.nanoseconds(threshold)
        self.heartbeatTicks = max(1_000_000, Monotonic.nanoseconds(heartbeat))
        // User-interactive: on Darwin a lower QoS lets the system coalesce and
        // delay the detector's wake-ups, which would make late looks (and, with
        // the late-look rule, missed stalls) out of the detector's own lateness.
        self.detectorQueue = DispatchQueue(label: "StallDetector", qos: .userInteractive)
        self.postQueue = DispatchQueue(label: "StallDetector.post", qos: .userInitiated)
        self.sampling = SamplingContext()
        let now = Monotonic.now()
        let state = Locked(State(tracker: StallTracker(threshold: thresholdTicks, now: now), lastObservation: now))
        self.state = state
        // Two missed heartbeats, or a tenth of the threshold if longer; for a
        // heartbeat, from half a heartbeat after an answer (as the overdue time).
        let lead = min(thresholdTicks, max(2 * heartbeatTicks, thresholdTicks / 10))
        self.profiler = StallProfiler(
            queue: detectorQueue, scheduler: scheduler, sampling: sampling, target: target,
            fatalReportPath: fatalReportPath,
            lateAfter: target.usesHeartbeat ? lead + max(1_000_000, Monotonic.nanoseconds(heartbeat)) / 2 : lead,
            lastAnswering: { state.withLock { ($0.lastAnsweringThread, $0.lastAnsweringQueue) } },
            owesAnswer: { [reportsWhileDebugged, isTraced] in
                let owes = state.withLock { state in
                    state.lifecycle == .running && !state.tracker.isStalled && state.tracker.dueTime != nil
                }
                // No samples while a debugger is attached (its stalls are not reported).
                return owes && (reportsWhileDebugged || !isTraced())
            })
    }

    // MARK: Lifecycle

    func start() {
        let begin = state.withLock { state -> Bool in
            guard state.lifecycle == .idle else { return false }
            state.lifecycle = .running
            return true
        }
        guard begin else { return }
        StopWitness.acquire()
        let sampling = self.sampling
        detectorQueue.async { sampling.warmUp() }
        var observer: RunLoopObserverHandle?
        if case .mainRunLoop = target {
            observer = RunLoopObserverHandle(onActivity: { [weak self] time, idle in
                self?.record(activityAt: time, idle: idle)
            })
        }
        let now = Monotonic.now()
        // Started from the main run loop's own pass (an app's launch): that pass
        // is busy now, and the observer sees its end, not its start.
        let inRunLoopPass = observer != nil && RunLoopObserverHandle.isInMainRunLoopPass
        let removeObserver = state.withLock { state -> Bool in
            guard state.lifecycle == .running else { return true }
            state.observer = observer
            state.tracker = StallTracker(threshold: thresholdTicks, now: now)
            state.lastObservation = now
            state.lastContinueSeen = now
            if target.usesHeartbeat {
                startProbe(&state, now: now)
            } else if inRunLoopPass {
                _ = state.tracker.progress(at: now, busyAfterwards: true)
            }
            if target.usesHeartbeat || inRunLoopPass { state.overdue = makeOverdue(&state, timeout: overdueTimeout) }
            return false
        }
        if removeObserver { observer?.remove() }
        if target.usesHeartbeat || inRunLoopPass { profiler.answered() }
    }

    func stop() {
        let taken = state.withLock { state -> (RepeatingTimer?, DelayedWork?, RunLoopObserverHandle?, Bool) in
            let wasRunning = state.lifecycle == .running
            state.lifecycle = .stopped
            defer {
                state.probe = nil
                state.overdue = nil
                state.observer = nil
            }
            return (state.probe, state.overdue, state.observer, wasRunning)
        }
        let (probe, overdue, observer, wasRunning) = taken
        probe?.cancel()
        overdue?.cancel()
        observer?.remove()
        profiler.stop()
        if wasRunning {
            detectorQueue.sync {}  // a sample in progress finishes and emits nothing more
            StopWitness.release()
        }
        continuation.finish()
    }

    /// The watchdog's timeout while the target is healthy: from an answer to the
    /// moment the next probe's answer is overdue (the stall's start is estimated at
    /// the midpoint between the answer and the next probe).
    private var overdueTimeout: Int64 {
        target.usesHeartbeat ? thresholdTicks + heartbeatTicks / 2 : thresholdTicks
    }

    // MARK: Timers (called with the lock held; they only arm, never release)

    private func startProbe(_ state: inout State, now: Int64) {
        let queue: DispatchQueue
        switch target {
        case .mainRunLoop: return
        case .mainQueue: queue = .main
        case .queue(let watched): queue = watched
        case .custom(_, let post):
            startPostedProbe(&state, now: now, post: post)
            return
        case .cooperativePool:
            startPostedProbe(&state, now: now) { probe in
                Task.detached(priority: .medium) { probe() }
            }
            return
        }
        let probe = RepeatingTimer(interval: heartbeat, missedTicks: .skip, queue: queue, scheduler: scheduler) {
            [weak self] in
            self?.record(answerAt: Monotonic.now(), answer: .here())
        }
        state.probeGridStart = now
        state.tracker.probeSent(at: now + heartbeatTicks)
        probe.start()
        state.probe = probe
    }

    /// A probe that `post` hands to an executor: the timer's firing calls `post` on
    /// the post queue, and the probe answers when it runs.
    private func startPostedProbe(
        _ state: inout State, now: Int64, post: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void
    ) {
        let probe = RepeatingTimer(
            interval: heartbeat, missedTicks: .skip, queue: postQueue, scheduler: scheduler
        ) { [weak self] in
            self?.postProbe(post)
        }
        state.probeGridStart = now
        state.tracker.probeSent(at: now + heartbeatTicks)
        probe.start()
        state.probe = probe
    }

    /// Hands `post` a new probe, unless one is outstanding (on
    /// the post queue, without the lock: `post` is the user's code).
    private func postProbe(_ post: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void) {
        let posting = state.withLock { state -> Bool in
            guard state.lifecycle == .running, !state.postedProbeOutstanding else { return false }
            state.postedProbeOutstanding = true
            return true
        }
        guard posting else { return }
        let probe = CustomProbe { [weak self] answer in
            self?.postedProbeFinished(answer)
        }
        // A block of its own, after this timer handler has returned: cancelling the
        // timer waits for a handler under way, and `stop()` must not wait for `post`.
        postQueue.async { post(probe.closure) }
    }

    /// A custom probe ran (an answer), or was released without running (nil:
    /// the next heartbeat posts another; the answer is still owed).
    private func postedProbeFinished(_ answer: ProbeAnswer?) {
        state.withLock { $0.postedProbeOutstanding = false }
        if let answer { record(answerAt: Monotonic.now(), answer: answer) }
    }

    /// The next probe after an answer at `time`: the next point of the timer's grid.
    private func nextProbe(after time: Int64, _ state: State) -> Int64 {
        let elapsed = max(0, time - state.probeGridStart)
        return state.probeGridStart + (elapsed / heartbeatTicks + 1) * heartbeatTicks
    }

    private func makeOverdue(_ state: inout State, timeout: Int64) -> DelayedWork {
        state.overdueGeneration &+= 1
        state.overdueTimeout = timeout
        let generation = state.overdueGeneration
        return DelayedWork.schedule(after: .nanoseconds(timeout), on: detectorQueue, scheduler: scheduler) {
            [weak self] in
            DetectorThreads.work { self?.overdue(generation: generation) }
        }
    }

    /// The stack an `.ended` event shows: the sample of the thread that answered,
    /// unless it was idle then (a `queue.sync` caller blocks, a worker answers);
    /// never an idle stack in place of the one `.started` reported.
    private static func endedBacktrace(
        answeredBy thread: Int32?, samples: [Int32: StallBacktrace], reported: StallBacktrace
    ) -> StallBacktrace {
        guard let thread, let sample = samples[thread], !StackShape.looksIdle(sample.frames) else { return reported }
        return sample
    }

    /// Keeps the overdue deadline `overdueTimeout` from now: the pending look
    /// moved back, or a new one when the current one ran or has another timeout.
    /// Returns the replaced look, to be cancelled after the lock.
    private func rearmOverdue(_ state: inout State) -> DelayedWork? {
        if let current = state.overdue, state.overdueTimeout == overdueTimeout,
            current.reschedule(after: .nanoseconds(overdueTimeout))
        {
            return nil
        }
        let replaced = state.overdue
        state.overdue = makeOverdue(&state, timeout: overdueTimeout)
        return replaced
    }

    /// Cancels a replaced look on the detector queue: a cancel waits for a
    /// running look, which runs there, and the target's thread must never wait
    /// for that. (Cancelled, not just released: a `DelayedWork` still runs when
    /// its handle goes.)
    private func releaseOnDetectorQueue(_ work: DelayedWork?) {
        guard let work else { return }
        detectorQueue.async { _ = work.cancel() }
    }

    // MARK: Facts from the target

    private func record(answerAt time: Int64, answer: ProbeAnswer) {
        var replaced: DelayedWork?
        var settled = false
        let outcome = state.withLock { state -> Outcome? in
            guard state.lifecycle == .running else { return nil }
            state.lastAnsweringThread = answer.thread
            state.lastAnsweringQueue = answer.queue
            state.lastObservation = max(state.lastObservation, time)
            let outcome = finish(state.tracker.progress(at: time), &state, thread: answer.thread)
            replaced = rearmOverdue(&state)
            state.tracker.probeSent(at: nextProbe(after: time, state))
            settled = state.open == nil
            return outcome
        }
        releaseOnDetectorQueue(replaced)
        let gathered = settled ? profiler.end() : nil
        profiler.answered()
        if let outcome { conclude(outcome, gathered: gathered) }
    }

    private func record(activityAt time: Int64, idle: Bool) {
        var replaced: DelayedWork?
        var settled = false
        let outcome = state.withLock { state -> Outcome? in
            guard state.lifecycle == .running else { return nil }
            state.lastObservation = max(state.lastObservation, time)
            let event = idle ? state.tracker.idle(at: time) : state.tracker.progress(at: time, busyAfterwards: true)
            let outcome = finish(event, &state, thread: nil)
            if !idle { replaced = rearmOverdue(&state) }
            settled = state.open == nil
            return outcome
        }
        releaseOnDetectorQueue(replaced)
        let gathered = settled ? profiler.end() : nil
        if idle { profiler.idle() } else { profiler.answered() }
        if let outcome { conclude(outcome, gathered: gathered) }
    }

    /// What an answer (or run-loop activity) concluded: a reported stall ended,
    /// or a stall no look saw in time has come and gone.
    private enum Outcome {
        case ended(id: UInt64, duration: Int64, backtrace: StallBacktrace, sampling: Int64)
        case missed(id: UInt64, duration: Int64, since: Int64)
    }

    /// The outcome of a tracker event for the open stall, if any.
    private func finish(_ event: StallTracker.Event?, _ state: inout State, thread: Int32?) -> Outcome? {
        if case .missed(let id, let duration) = event {
            return .missed(id: id, duration: duration, since: state.lastContinueSeen)
        }
        guard case .ended(let id, let duration) = event, var stall = state.open, stall.id == id else { return nil }
        switch stall.phase {
        case .sampling:
            // The sampler emits both events.
            stall.endedWhileSampling = (duration, thread)
            state.open = stall
            return nil
        case .awaitingConfirmation:
            // Not confirmed by the first look, and the target answered before a
            // second one: reported as a missed stall if the profile's samples
            // saw the target's job running meanwhile.
            state.open = nil
            return stall.suppressed ? nil : .missed(id: id, duration: duration, since: state.lastContinueSeen)
        case .reported:
            break
        }
        state.open = nil
        if stall.suppressed { return nil }
        let confirmed = Self.endedBacktrace(answeredBy: thread, samples: stall.samples, reported: stall.reported)
        return .ended(id: id, duration: duration, backtrace: confirmed, sampling: stall.sampling)
    }

    /// Emits an outcome's events on the detector queue, where the stall's samples
    /// are named: never on the target's thread, whose answer concluded it.
    private func conclude(_ outcome: Outcome, gathered: StallProfiler.Gathered?) {
        detectorQueue.async { [self] in DetectorThreads.work { emit(outcome, gathered: gathered) } }
    }

    private func emit(_ outcome: Outcome, gathered: StallProfiler.Gathered?) {
        let profile = gathered.map { profiler.profile(of: $0) } ?? .empty
        let activities = gathered?.activities ?? []
        switch outcome {
        case .ended(let id, let duration, let backtrace, let sampling):
            deliver([
                makeEvent(
                    id: id, phase: .ended, duration: duration, backtrace: backtrace, sampling: sampling,
                    profile: (profile, activities))
            ])
        case .missed(let id, let duration, let since):
            // Not a stall if the process was stopped meanwhile (the witness may
            // need a moment to record the continue), nor while debugged.
            let now = Monotonic.now()
            let continued = StopWitness.latestContinue(after: since, waitingAtMost: min(thresholdTicks, 500_000_000))
            guard continued.map({ $0 < now - duration }) ?? true, reportsWhileDebugged || !isTraced() else { return }
            // Only with evidence that the target ran its own code meanwhile (a
            // sample of the thread running its job): a process that did not get
            // the CPU at all (stopped, or starved) answers late too.
            guard let backtrace = lastSample(gathered) else { return }
            for phase in [StallEvent.Phase.started, .ended] {
                continuation.yield(
                    makeEvent(
                        id: id, phase: phase, duration: duration, backtrace: backtrace, sampling: 0,
                        profile: (profile, activities)))
            }
        }
    }

    /// The last sample a session took, named: a missed stall's stack.
    private func lastSample(_ gathered: StallProfiler.Gathered?) -> StallBacktrace? {
        guard let last = gathered?.recorder.samples.last, last.frames != StallProfiler.unsampledRaw else { return nil }
        let frames = sampling.names([last.frames])[0]
        return StallBacktrace(frames: frames, threadID: nil, unavailableReason: nil)
    }

    // MARK: The overdue deadline (on the detector queue)

    /// What a look decided: nothing to do, a stall goes on (the fatal report may
    /// be due), or a stall to sample and report.
    private enum Look {
        case nothing
        case stallGoesOn
        case sample(Decision)
    }

    /// A stall to sample: its id, how long it has lasted, whether it is
    /// suppressed (a debugger), and whether this is the second look at it.
    private struct Decision {
        var id: UInt64
        var duration: Int64
        var suppressed: Bool
        var second: Bool
    }

    /// What the sample of a stall leads to.
    private enum Report {
        case nothing
        /// Events of the stall, `.started` and (if it ended while sampled) `.ended`.
        case events(started: Bool, ended: (duration: Int64, backtrace: StallBacktrace)?)
        /// Not confirmed, and ended while sampled: a missed stall.
        case missed(Outcome)
    }

    private func overdue(generation: UInt64) {
        // The moment this look is about. Read before asking the witness: a stop that
        // ends before it is then always seen, and one that starts after it does not
        // concern this look.
        let now = Monotonic.now()
        // Was the process stopped since the detector last looked? (May wait for the
        // witness to record a continue it has not had the CPU to record yet.)
        let since = state.withLock { $0.lastContinueSeen }
        let continued = StopWitness.latestContinue(after: since, waitingAtMost: min(thresholdTicks, 500_000_000))
        var replaced: DelayedWork?
        let look = state.withLock { state in
            self.look(&state, now: now, continued: continued, generation: generation, replaced: &replaced)
        }
        // The replaced look is cancelled here, on the detector queue, after the lock
        // (the one running now, this one, returns at once).
        _ = replaced?.cancel()
        switch look {
        case .nothing: return
        case .stallGoesOn: profiler.refreshFatalReport(now: now)
        case .sample(let decision): sampleAndReport(decision, now: now)
        }
    }

    /// The look's decision, with the lock held: the tracker asked, the next look
    /// armed (the one it replaces returned in `replaced`, to cancel after the lock).
    private func look(
        _ state: inout State, now: Int64, continued: Int64?, generation: UInt64, replaced: inout DelayedWork?
    ) -> Look {
        guard state.lifecycle == .running, generation == state.overdueGeneration else { return .nothing }
        if let continued, continued > state.lastContinueSeen {
            // Owed answers are owed afresh from this look, the detector's first since
            // the continue: a process that gets the CPU late after a stop (a loaded
            // machine) is not stalled for that.
            state.tracker.continued(at: max(continued, now), lastObservation: state.lastObservation)
            state.lastContinueSeen = continued
        }
        state.lastObservation = max(state.lastObservation, now)
        replaced = state.overdue
        if var stall = state.open, stall.phase == .awaitingConfirmation, let start = state.tracker.stall?.start {
            // The second look at an unconfirmed stall: the target still owes.
            stall.phase = .sampling
            state.open = stall
            state.overdue = makeOverdue(&state, timeout: heartbeatTicks)
            return .sample(Decision(id: stall.id, duration: now - start, suppressed: stall.suppressed, second: true))
        }
        guard case .started(let id, let duration) = state.tracker.tick(now: now) else {
            // Not (or no longer) overdue: keep watching if anything is owed.
            let owes = state.tracker.isStalled || state.tracker.dueTime != nil
            state.overdue =
                owes ? makeOverdue(&state, timeout: state.tracker.isStalled ? heartbeatTicks : overdueTimeout) : nil
            return state.tracker.isStalled ? .stallGoesOn : .nothing
        }
        let suppressed = !reportsWhileDebugged && isTraced()
        state.open = OpenStall(id: id, suppressed: suppressed)
        // While the stall lasts, look every heartbeat, so that a stop during it is
        // measured within a heartbeat.
        state.overdue = makeOverdue(&state, timeout: heartbeatTicks)
        return .sample(Decision(id: id, duration: duration, suppressed: suppressed, second: false))
    }

    /// Samples a stall the look found, and emits what that leads to.
    private func sampleAndReport(_ decision: Decision, now: Int64) {
        let sampleStart = Monotonic.now()
        var reported = StallBacktrace.unavailable("not sampled: a debugger is attached")
        var samples: [Int32: StallBacktrace] = [:]
        if !decision.suppressed {
            let (lastAnswering, queue) = state.withLock { ($0.lastAnsweringThread, $0.lastAnsweringQueue) }
            (reported, samples) = sampling.sampleBlockedThread(
                target: target, lastAnswering: lastAnswering, queue: queue)
            profiler.stallStarted(
                backtrace: reported, activities: ActivityRecord.activities(ofThread: reported.threadID),
                start: now - decision.duration, at: sampleStart)
        }
        let samplingTime = Monotonic.now() - sampleStart
        // A heartbeat target's stall is confirmed by a thread running a job (or by a
        // second look); the main run loop's culprit is the main thread by definition.
        let confirmed =
            decision.second || decision.suppressed || !target.usesHeartbeat || target.isConfirmed(by: reported)
        var settled = false
        let report = state.withLock { state in
            defer { settled = state.open == nil }
            return Self.report(
                &state, decision, reported: reported, samples: samples, samplingTime: samplingTime,
                confirmed: confirmed)
        }
        let gathered = settled ? profiler.end() : nil
        switch report {
        case .nothing:
            return
        case .missed(let outcome):
            emit(outcome, gathered: gathered)
        case .events(let started, let ended):
            let profile = gathered.map { (profiler.profile(of: $0), $0.activities) } ?? profiler.snapshot()
            var events: [StallEvent] = []
            if started {
                var event = makeEvent(
                    id: decision.id, phase: .started, duration: decision.duration, backtrace: reported,
                    sampling: samplingTime, profile: profile)
                if case .cooperativePool = target {
                    event.poolBacktraces =
                        [reported]
                        + samples.sorted { $0.key < $1.key }.map(\.value).filter { $0.threadID != reported.threadID }
                }
                events.append(event)
            }
            if let ended {
                events.append(
                    makeEvent(
                        id: decision.id, phase: .ended, duration: ended.duration, backtrace: ended.backtrace,
                        sampling: samplingTime, profile: profile))
            }
            deliver(events, stallStart: now - decision.duration)
        }
    }

    /// The bookkeeping after a stall was sampled (with the lock held): what to
    /// report.
    private static func report(
        _ state: inout State, _ decision: Decision, reported: StallBacktrace, samples: [Int32: StallBacktrace],
        samplingTime: Int64, confirmed: Bool
    ) -> Report {
        guard state.lifecycle == .running, var stall = state.open, stall.id == decision.id else { return .nothing }
        stall.samples = samples
        stall.reported = reported
        stall.sampling = samplingTime
        guard confirmed else {
            // Look again in a heartbeat. Ended meanwhile: a missed stall, reported
            // if the profile's samples saw its job running.
            stall.phase = .awaitingConfirmation
            state.open = stall.endedWhileSampling == nil ? stall : nil
            guard let ended = stall.endedWhileSampling, !stall.suppressed else { return .nothing }
            return .missed(.missed(id: stall.id, duration: ended.duration, since: state.lastContinueSeen))
        }
        stall.phase = .reported
        guard let ended = stall.endedWhileSampling else {
            state.open = stall
            return stall.suppressed ? .nothing : .events(started: true, ended: nil)
        }
        state.open = nil
        guard !stall.suppressed else { return .nothing }
        let backtrace = endedBacktrace(answeredBy: ended.thread, samples: samples, reported: reported)
        return .events(started: true, ended: (ended.duration, backtrace))
    }

    /// Yields events; a `.started` one is written as the fatal report, an `.ended`
    /// one removes it.
    private func deliver(_ events: [StallEvent], stallStart: Int64 = 0) {
        for event in events {
            continuation.yield(event)
            switch event.phase {
            case .started: profiler.stallReported(event, start: stallStart, at: Monotonic.now())
            case .ended: profiler.fatal?.remove()
            }
        }
    }

    private func makeEvent(
        id: UInt64, phase: StallEvent.Phase, duration: Int64, backtrace: StallBacktrace, sampling: Int64,
        profile gathered: (StallProfile, [String])? = nil
    ) -> StallEvent {
        let (profile, activities) = gathered ?? profiler.snapshot()
        return StallEvent(
            id: id, phase: phase, duration: .nanoseconds(duration), threshold: threshold,
            target: target.description, backtrace: backtrace, samplingTime: .nanoseconds(sampling), profile: profile,
            activities: activities)
    }
}

extension StallDetector.Target {
    var usesHeartbeat: Bool {
        if case .mainRunLoop = self { return false }
        return true
    }

    /// Whether a first sample confirms a heartbeat target's stall at once: a
    /// dispatch queue's by a thread running a job; a custom executor's by the
    /// thread that last ran a probe doing anything but waiting for work.
    func isConfirmed(by sample: StallBacktrace) -> Bool {
        switch self {
        case .cooperativePool:
            sample.unavailableReason == nil && StackShape.runsSwiftJob(sample.frames)
        case .custom:
            sample.unavailableReason == nil
                && !SamplingContext.isIdle(sample, thread: Int32(truncatingIfNeeded: sample.threadID ?? 0))
        default:
            StackShape.runsJob(sample.frames)
        }
    }
}
