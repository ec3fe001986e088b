import CStallCapture
import Dispatch
import SafeTimers
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The engine of a ``StallDetector``. It runs on SafeTimers' engine and on
/// threads of its own (``DetectorWorker``s, each started with work and ended
/// after an idle while), never on a dispatch worker: a program whose queues
/// hold every dispatch worker still gets its stalls reported.
///
/// - Heartbeat targets: a member of the process's shared ``Heartbeat`` of its
///   period. Each beat posts the probe, a tiny block on the target queue,
///   unless one is still queued or running (a blocked target gets one probe,
///   not a pile), and arms the overdue look only when the answer owed would be
///   overdue before the next beat. With nothing stalled, the detector costs the
///   probe and a few instructions of the shared beat per heartbeat: no timer of
///   its own, no look armed, no CPU time read at a prompt answer.
/// - Posted probes (`.custom`, `.cooperativePool`): the beat hands the user's
///   `post` (or `Task.detached`) a ``CustomProbe`` in a block of its own on a
///   post thread of its own, at most one outstanding; the probe answers when it
///   runs and frees the slot when it runs or is released unrun. `post` is never called
///   under the lock nor on the scheduler thread, so a blocking `post` can block
///   neither `stop()` nor another detector.
/// - The main run loop: a run-loop observer records each activity and moves the
///   overdue look while the loop is busy.
/// - When the overdue look runs, the detector's thread asks ``StopWitness``
///   whether the process was stopped meanwhile, asks the ``DetectorMachine`` whether the target
///   is stalled, and if so samples the blocked thread and emits `.started`. The
///   answer that finally comes emits `.ended`.
///
/// Every decision is the ``DetectorMachine``'s, made under `state`'s lock with the
/// time it concerns and the facts read before it (the witness, `/proc`, samples);
/// this class only carries out its plans. Timers (armed, moved, cancelled),
/// sampling, symbolication and event delivery happen after the lock is released.
final class DetectorCore: Sendable, HeartbeatMember {
    let threshold: Duration
    let heartbeat: Duration
    /// The widest spacing of probes while the target answers promptly: a
    /// whole number of heartbeats.
    let idleHeartbeat: Duration
    private let target: StallDetector.Target
    /// The target, for ``StallDetector/target``.
    var watchedTarget: StallDetector.Target { target }

    /// Waits until the `onEvent` handler has been called with every event
    /// concluded so far: those the detector's thread has still to publish (a
    /// stall's end, or a stall no look saw in time, is emitted there after the
    /// target's answer settled the detector), then the handler's calls. Not on
    /// the detector's thread (stop() from the handler waits for it the same way).
    func waitForHandler() {
        detectorThread.sync {}
        outlet.waitForHandler()
    }

    /// Whether a stop now would lose a stall (see ``DetectorMachine/Settlement``);
    /// `.sampling` too while an outcome the target's answer concluded is still
    /// to be emitted on the detector's thread.
    func settlement() -> DetectorMachine.Settlement {
        let now = Monotonic.now()
        return state.withLock { $0.concluding > 0 ? .sampling : $0.machine.settlement(now: now) }
    }

    /// The lags recorded since the window began; with `reset`, a new window
    /// begins. (The copy of the buckets is made here, so the next answer on the
    /// target's thread does not make it.)
    func lagSnapshot(reset: Bool) -> StallDetector.LagSnapshot {
        // The next window's buckets are allocated here, not on a probe's answer.
        let next = reset ? LagHistogram.prepared() : nil
        // The clock is read under the lock: windows taken by concurrent resets
        // then follow each other without overlap.
        let (histogram, window) = state.withLock { state -> (LagHistogram, Int64) in
            let now = Monotonic.now()
            let taken = (reset ? state.lag : state.lag.detached(), max(0, now - state.lagWindowStart))
            if let next {
                state.lag = next
                state.lagWindowStart = now
            }
            return taken
        }
        return StallDetector.LagSnapshot(histogram: histogram, window: window)
    }
    private let reportsWhileDebugged: Bool
    /// Whether a debugger is attached; `/proc/self/status` unless a test injects one.
    private let isTraced: @Sendable () -> Bool
    private let outlet: StallEventOutlet
    private let scheduler: any TimerScheduler
    private let thresholdTicks: Int64
    private let heartbeatTicks: Int64
    /// Where looks, sampling and symbolication run; never the target.
    private let detectorThread: DetectorWorker
    /// Where a custom target's `post` is called: not the detector's thread, so
    /// that a `post` that blocks cannot delay the detection of the stall it
    /// causes.
    private let postThread: DetectorWorker
    private let sampling: SamplingContext
    /// Whether the symbol warm-up was started. It starts at the target's first
    /// answer or activity, or at the first look when none came: reading symbol
    /// tables takes the Swift runtime's locks many times over (type metadata,
    /// conformances), and a first probe that needed them meanwhile waited for
    /// it (a false stall of 0.76 s, the probe blocked in
    /// `__swift_instantiateConcreteTypeFromMangledName`, in a process at nice 19
    /// beside two busy ones).
    private let warmUpStarted = Atomic<Bool>(false)
    /// Answers that read their time and are not recorded yet: a look that
    /// finds one does not decide (``AnswersUnderWay``).
    private let answers = AnswersUnderWay()
    /// Samples the blocked thread while a stall lasts; keeps the fatal report.
    let profiler: StallProfiler

    /// The machine and what acts on its decisions: the timers and the observer.
    private struct State {
        var machine: DetectorMachine
        /// The heartbeat this detector is a member of (heartbeat targets).
        var heartbeat: Heartbeat?
        /// The look: runs when the target would be overdue; `lookGeneration`
        /// tells a current firing from a stale one.
        var look: DelayedWork?
        var lookGeneration: UInt64 = 0
        /// The generation of a look decided under the lock and armed after it,
        /// until it is kept in `look` (or found stale): a look counts as armed
        /// meanwhile.
        var lookArming: UInt64?
        var lookTimeout: Int64 = 0
        /// When the current look is due, and how long after its due time the
        /// last look ran (the detector's threads waited for a core).
        var lookDue: Int64 = 0
        var lastLookWaited: Int64 = 0
        var observer: RunLoopObserverHandle?
        /// The lags of this window, and when the window began.
        var lag = LagHistogram.prepared()
        var lagWindowStart = Monotonic.now()
        /// Outcomes an answer or an activity concluded that the detector's thread
        /// has not emitted yet: the detector is not settled until they are.
        var concluding = 0
    }

    private let state: Locked<State>
    /// Whether ``stop()`` was called; the first call is in `stopping` until it
    /// has ended the outlet, and a later call waits for it.
    private let stopCalled = Locked(false)
    private let stopping = DispatchGroup()

    init(
        target: StallDetector.Target, threshold: Duration, heartbeat: Duration, idleHeartbeat: Duration? = nil,
        reportsWhileDebugged: Bool,
        isTraced: @escaping @Sendable () -> Bool = ProcessFacts.isTraced,
        scheduler: any TimerScheduler = SystemTimerScheduler.shared,
        fatalReportPath: String? = nil,
        outlet: StallEventOutlet
    ) {
        self.isTraced = isTraced
        self.target = target
        self.threshold = threshold
        self.heartbeat = heartbeat
        self.reportsWhileDebugged = reportsWhileDebugged
        self.outlet = outlet
        self.scheduler = scheduler
        self.thresholdTicks = Monotonic.nanoseconds(threshold)
        let heartbeatTicks = max(1_000_000, Monotonic.nanoseconds(heartbeat))
        self.heartbeatTicks = heartbeatTicks
        let widestSpacing =
            target.usesHeartbeat ? idleHeartbeat.map { max(1, Monotonic.nanoseconds($0) / heartbeatTicks) } ?? 1 : 1
        self.idleHeartbeat = .nanoseconds(widestSpacing * heartbeatTicks)
        self.detectorThread = DetectorWorker(name: "StallDetector")
        self.postThread = DetectorWorker(name: "StallPost")
        self.sampling = SamplingContext()
        let now = Monotonic.now()
        let machine = DetectorMachine(
            threshold: thresholdTicks, heartbeat: heartbeatTicks, usesHeartbeat: target.usesHeartbeat, now: now,
            queue: target.ownedQueueAddress, widestSpacing: widestSpacing)
        let state = Locked(State(machine: machine))
        self.state = state
        // Two missed heartbeats, or a tenth of the threshold if longer; for a
        // heartbeat, from half a heartbeat after an answer (as the overdue time).
        let lead = min(thresholdTicks, max(2 * heartbeatTicks, thresholdTicks / 10))
        self.profiler = StallProfiler(
            worker: detectorThread, scheduler: scheduler, sampling: sampling, target: target,
            fatalReportPath: fatalReportPath,
            lateAfter: target.usesHeartbeat ? lead + max(1_000_000, Monotonic.nanoseconds(heartbeat)) / 2 : lead,
            lastAnswering: { state.withLock { ($0.machine.lastAnsweringThread, $0.machine.lastAnsweringQueue) } },
            owesAnswer: { [reportsWhileDebugged, isTraced] in
                let owes = state.withLock { $0.machine.owesAnswer }
                // No samples while a debugger is attached (its stalls are not reported).
                return owes && (reportsWhileDebugged || !isTraced())
            })
    }

    // MARK: Lifecycle

    func start() {
        guard state.withLock({ $0.machine.begin() }) else { return }
        StopWitness.acquire()
        let sampling = self.sampling
        detectorThread.async { DetectorThreads.work { sampling.prepare() } }
        var observer: RunLoopObserverHandle?
        if case .mainRunLoop = target {
            observer = RunLoopObserverHandle(onActivity: { [weak self] idle in
                guard let self else { return }
                answers.answer { time in record(activityAt: time, idle: idle) }
            })
        }
        // Joined first, for its grid; its beats find nothing to do until the
        // machine watches.
        let heartbeat =
            target.usesHeartbeat ? Heartbeat.join(self, period: heartbeatTicks, scheduler: scheduler) : nil
        let now = Monotonic.now()
        let cpu = ProcessFacts.cpuTime()
        // Started from the main run loop's own pass (an app's launch): that pass
        // is busy now, and the observer sees its end, not its start.
        let inRunLoopPass = observer != nil && RunLoopObserverHandle.isInMainRunLoopPass
        let watching = state.withLock { state -> LookChange? in
            guard
                let plan = state.machine.watch(
                    from: now, inRunLoopPass: inRunLoopPass, cpu: cpu, gridStart: heartbeat?.origin)
            else { return nil }
            state.observer = observer
            state.heartbeat = heartbeat
            return apply(plan, &state)  // nothing was armed before
        }
        if let watching {
            carryOut(watching)
        } else {
            observer?.remove()
            heartbeat?.leave(self)
        }
        // The profiler's early look counts from the start until the first answer.
        if target.usesHeartbeat { profiler.targetAnswered(at: now) }
        if inRunLoopPass { profiler.answered() }
    }

    /// Stops, and ends a reported stall the stop cuts short with an `.ended`
    /// event marked ``StallEvent/endedByStop``: published before the outlet
    /// finishes, so the stream yields it last and the handler gets it before this
    /// returns (see ``StallEventOutlet/finish()``).
    ///
    /// A call while another is under way waits until that one has ended the
    /// outlet, so that it too returns after the last event; called from the
    /// `onEvent` handler (which the other call may be waiting for), it waits
    /// for nothing and the handler is not called again.
    func stop() {
        let first = stopCalled.withLock { called -> Bool in
            guard !called else { return false }
            called = true
            stopping.enter()
            return true
        }
        guard first else {
            if outlet.isHandlerThread { outlet.closeFromHandler() } else { stopping.wait() }
            return
        }
        defer { stopping.leave() }
        let now = Monotonic.now()
        let taken = state.withLock { state in
            state.lookGeneration &+= 1  // a look armed after its lock is not kept
            return (state.heartbeat.take(), state.look.take(), state.observer.take(), state.machine.stop(at: now))
        }
        let (heartbeat, look, observer, (wasRunning, cutShort)) = taken
        heartbeat?.leave(self)
        look?.cancel()
        observer?.remove()
        waitForConcluded()
        let gathered = cutShort == nil ? nil : profiler.end()
        profiler.stop()
        if wasRunning {
            // A sample in progress finishes and emits nothing more; then the
            // stall the stop cut short ends, after any event emitted before.
            detectorThread.sync { [self] in
                if let cutShort { DetectorThreads.work { endCutShort(cutShort, gathered: gathered) } }
            }
            StopWitness.release()
        }
        detectorThread.finish()
        postThread.finish()
        outlet.finish()
    }

    /// Waits until every outcome the target's answer concluded before the stop
    /// has been emitted (`State.concluding`): the answer's thread decides a
    /// stall's `.ended` under the lock and hands it to the detector's thread
    /// after it, and a stop in between found no stall to cut short and would
    /// finish the outlet first: the `.ended` of a reported stall would be
    /// lost. The hand-over takes microseconds; nothing it does waits for
    /// `stop()`. (On the detector's own thread, where the emission queues
    /// behind the caller, nothing can be waited for.)
    private func waitForConcluded() {
        guard !detectorThread.isCurrent else { return }
        while state.withLock({ $0.concluding > 0 }) {
            detectorThread.sync {}
            if state.withLock({ $0.concluding > 0 }) { usleep(100) }
        }
    }

    /// Publishes the `.ended` event of a stall that ``stop()`` cut short.
    private func endCutShort(_ outcome: DetectorMachine.Outcome, gathered: StallProfiler.Gathered?) {
        guard case .ended(let id, let duration, let backtrace, let sampling) = outcome else { return }
        let profile = gathered.map { (profiler.profile(of: $0), $0.activities) } ?? (.empty, [])
        var event = makeEvent(
            id: id, phase: .ended, duration: duration, backtrace: backtrace, sampling: sampling, profile: profile)
        event.endedByStop = true
        outlet.publish(event)
    }

    // MARK: Beats and probes

    /// On the scheduler thread: the machine decides whether to post a probe and
    /// whether the look is due before the next beat; the post happens after the
    /// lock, and the profiler arms its early look the same way.
    func beat(_ beat: Heartbeat.Beat) {
        if SamplingTrace.isEnabled { SamplingTrace.probe("beat", at: beat.time) }
        // Every probe is owed from the moment it is handed over (`handingOver()`),
        // not from the beat: the beat's other members, and this thread's waits for
        // a core, come between the two, and a block that starts meanwhile is
        // ahead of the probe.
        let planned = state.withLock { state -> (DetectorMachine.BeatPlan, LookChange, Int64?)? in
            let armed = state.look != nil || state.lookArming != nil
            guard
                let plan = state.machine.beat(at: beat.time, next: beat.next, cpu: beat.cpu, lookArmed: armed)
            else { return nil }
            // `.keep`, or `.arm` with no look armed.
            return (plan, apply(plan.look, &state), state.machine.lateCountedFrom)
        }
        guard let (plan, change, lateCountedFrom) = planned else { return }
        carryOut(change)
        if plan.post { postProbe() }
        if let (threads, owedSince) = plan.readSchedules {
            let read = threads.compactMap { thread in ProcessFacts.schedule(ofThread: thread).map { (thread, $0) } }
            state.withLock { $0.machine.schedulesRead(read, forAnswerOwedSince: owedSince) }
        }
        profiler.beat(now: beat.time, next: beat.next, notBefore: lateCountedFrom)
    }

    /// Hands the target its probe: a block on a watched queue, or a
    /// ``CustomProbe`` to `post` (or a detached task) from the post thread.
    private func postProbe() {
        let queue: DispatchQueue
        switch target {
        case .mainRunLoop: return
        case .mainQueue: queue = .main
        case .queue(let watched): queue = watched
        case .custom(_, let post):
            postProbe(post)
            return
        case .cooperativePool:
            postProbe { probe in
                Task.detached(priority: .medium) { probe() }
            }
            return
        }
        guard handingOver() else { return }
        queue.async { [weak self] in
            // Marked from its first instruction: what the answer then waits for
            // (the detector's locks) is no stall of the target's.
            stallcapture_probe_begin()
            defer { stallcapture_probe_end() }
            guard let self else { return }
            answers.answer { time in record(answerAt: time, answer: .here()) }
        }
    }

    /// Hands `post` a new probe in a block of its own on the post thread
    /// (`post` is the user's code: never on the scheduler thread, never under
    /// the lock). A block that runs after `stop()` calls nothing: the call is
    /// under way from the moment ``handingOver()`` saw the detector running.
    private func postProbe(_ post: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void) {
        let probe = CustomProbe(answers: answers) { [weak self] answer, time in
            self?.postedProbeFinished(answer, at: time)
        }
        postThread.async { [weak self] in
            guard let self, handingOver() else { return }
            post(probe.closure)
        }
    }

    /// Tells the machine a probe is being handed to the target now (right
    /// before a queue's `async`, or a custom target's `post`); false when the
    /// detector stopped meanwhile (nothing is handed over).
    private func handingOver() -> Bool {
        state.withLock { state in
            guard state.machine.lifecycle == .running else { return false }
            let now = Monotonic.now()
            state.machine.posted(at: now)
            if SamplingTrace.isEnabled { SamplingTrace.probe("posted", at: now) }
            return true
        }
    }

    /// A custom probe ran at `time` (an answer), or was released without
    /// running (nil: the next beat posts another; the answer is still owed).
    /// The slot is released with the answer recorded, under one lock: a probe
    /// posted in between would be owed from the grid point after this answer,
    /// later than its own posting, and a quick answer to it would count a lag
    /// of zero.
    private func postedProbeFinished(_ answer: ProbeAnswer?, at time: Int64) {
        guard let answer else {
            state.withLock { $0.machine.releaseProbeSlot() }
            return
        }
        record(answerAt: time, answer: answer)
    }

    /// What the machine's plan for the look leaves to do once the lock is
    /// released: no timer is armed, moved or cancelled under it (each takes
    /// the engine's locks, and the target's answer waits for this lock).
    private struct LookChange {
        /// A look to arm, of this generation, due in `timeout` nanoseconds.
        var arm: (generation: UInt64, timeout: Int64)?
        /// The armed look, to move to `timeout` from now.
        var move: (look: DelayedWork, generation: UInt64, timeout: Int64)?
        /// The look a new one replaced or the plan dropped, to cancel.
        var replaced: DelayedWork?
    }

    /// Records the machine's plan for the look under the lock (the generation
    /// that tells a current firing from a stale one, when the look is due);
    /// ``carryOut(_:onDetectorThread:)`` acts on it after the lock.
    private func apply(_ plan: DetectorMachine.LookPlan, _ state: inout State) -> LookChange {
        switch plan {
        case .keep:
            return LookChange()
        case .drop:
            state.lookGeneration &+= 1  // a firing already under way finds itself stale
            return LookChange(replaced: state.look.take())
        case .move(let timeout):
            guard let current = state.look, state.lookTimeout == timeout else { return prepareArm(timeout, &state) }
            state.lookDue = Monotonic.now() + timeout
            return LookChange(move: (current, state.lookGeneration, timeout))
        case .arm(let timeout):
            return prepareArm(timeout, &state)
        }
    }

    /// A new look: a new generation, and the current look replaced.
    private func prepareArm(_ timeout: Int64, _ state: inout State) -> LookChange {
        state.lookGeneration &+= 1
        state.lookTimeout = timeout
        state.lookDue = Monotonic.now() + timeout
        state.lookArming = state.lookGeneration
        return LookChange(arm: (state.lookGeneration, timeout), replaced: state.look.take())
    }

    /// Carries out a ``LookChange`` with no lock held. A replaced look is
    /// cancelled on the detector's thread (at once when called there). A look
    /// that cannot move (it fired meanwhile) is replaced by a new one, unless a
    /// later plan came first.
    private func carryOut(_ change: LookChange, onDetectorThread: Bool = false) {
        if onDetectorThread { _ = change.replaced?.cancel() } else { releaseOnDetectorThread(change.replaced) }
        if let move = change.move, !move.look.reschedule(after: .nanoseconds(move.timeout)) {
            let rearm = state.withLock { state -> LookChange in
                guard state.lookGeneration == move.generation, state.look === move.look else { return LookChange() }
                return prepareArm(move.timeout, &state)
            }
            carryOut(rearm, onDetectorThread: onDetectorThread)
        }
        if let arm = change.arm { armLook(generation: arm.generation, timeout: arm.timeout) }
    }

    /// Arms the look of `generation`, then keeps it unless a later plan (or
    /// ``stop()``) made it stale meanwhile; a stale one is cancelled without
    /// waiting (a firing finds itself stale and returns).
    private func armLook(generation: UInt64, timeout: Int64) {
        let look = DelayedWork.schedule(after: .nanoseconds(timeout), executor: detectorThread, scheduler: scheduler) {
            [weak self] in
            DetectorThreads.work { self?.look(generation: generation) }
        }
        let kept = state.withLock { state -> Bool in
            if state.lookArming == generation { state.lookArming = nil }
            guard state.lookGeneration == generation else { return false }
            state.look = look
            return true
        }
        if !kept { _ = look.cancelWithoutWaiting() }
    }

    /// Cancels a replaced look on the detector's thread: a cancel waits for a
    /// running look, which runs there, and the target's thread must never wait
    /// for that. (Cancelled, not just released: a `DelayedWork` still runs when
    /// its handle goes.)
    private func releaseOnDetectorThread(_ work: DelayedWork?) {
        guard let work else { return }
        detectorThread.async { _ = work.cancel() }
    }

    /// Starts the symbol warm-up once, on the process's naming-ahead thread
    /// (``Symbolicator/warmUpAhead()``): only an enqueue here.
    private func warmUpOnce() {
        guard !warmUpStarted.load(ordering: .relaxed), !warmUpStarted.exchange(true, ordering: .acquiringAndReleasing)
        else { return }
        Symbolicator.shared.warmUpAhead()
    }

    // MARK: Facts from the target

    /// A probe answered at `time`: the machine records it and frees the probe's
    /// slot. The process's CPU time is read only for an answer that may end or
    /// miss a stall.
    private func record(answerAt time: Int64, answer: ProbeAnswer) {
        if SamplingTrace.isEnabled { SamplingTrace.probe("answered", at: time) }
        let late = state.withLock { $0.machine.needsCPU(at: time) }
        let cpu = late ? ProcessFacts.cpuTime() : nil
        // This thread's time on and waiting for a core so far (the answer runs
        // on it), and its age.
        let schedule = late ? ProcessFacts.schedule(ofThread: nil) : nil
        let threadAge = late ? ProcessFacts.age(ofThread: nil) : nil
        let step = state.withLock { state -> (DetectorMachine.Step, LookChange)? in
            defer { state.machine.releaseProbeSlot() }
            guard
                let step = state.machine.answered(
                    at: time, thread: answer.thread, queue: answer.queue, cpu: cpu, schedule: schedule,
                    threadAge: threadAge)
            else {
                return nil
            }
            if let lag = step.lag { state.lag.record(lag) }
            if step.outcome != nil { state.concluding += 1 }
            return (step, apply(step.look, &state))
        }
        guard let (step, change) = step else { return }
        carryOut(change)
        profiler.targetAnswered(at: time)
        let gathered = step.settled ? profiler.end(until: time) : nil
        if let outcome = step.outcome { conclude(outcome, gathered: gathered) }
        // Last: the answer's own first run (type metadata) is done before.
        warmUpOnce()
    }

    private func record(activityAt time: Int64, idle: Bool) {
        let step = state.withLock { state -> (DetectorMachine.Step, LookChange)? in
            guard let step = state.machine.activity(at: time, idle: idle) else { return nil }
            if let lag = step.lag { state.lag.record(lag) }
            if step.outcome != nil { state.concluding += 1 }
            return (step, apply(step.look, &state))
        }
        guard let (step, change) = step else { return }
        carryOut(change)
        profiler.targetAnswered(at: time)
        let gathered = step.settled ? profiler.end(until: time) : nil
        if idle { profiler.idle() } else { profiler.answered() }
        if let outcome = step.outcome { conclude(outcome, gathered: gathered) }
        warmUpOnce()
    }

    /// Emits an outcome's events on the detector's thread, where the stall's samples
    /// are named: never on the target's thread, whose answer concluded it.
    private func conclude(_ outcome: DetectorMachine.Outcome, gathered: StallProfiler.Gathered?) {
        detectorThread.async { [self] in
            DetectorThreads.work { emit(outcome, gathered: gathered) }
            state.withLock { $0.concluding -= 1 }
        }
    }

    private func emit(_ outcome: DetectorMachine.Outcome, gathered: StallProfiler.Gathered?) {
        let profile = gathered.map { profiler.profile(of: $0) } ?? .empty
        let activities = gathered?.activities ?? []
        switch outcome {
        case .ended(let id, let duration, let backtrace, let sampling):
            deliver([
                makeEvent(
                    id: id, phase: .ended, duration: duration, backtrace: backtrace, sampling: sampling,
                    profile: (profile, activities))
            ])
        case .missed(let id, let duration, let since, let processRan, let waitedForCore):
            // The facts the machine weighs: whether the process was stopped
            // meanwhile (the witness may need a moment to record the continue),
            // a debugger, and evidence that the target ran its own code (its
            // thread's wait for a core, a sample of its job, the process's CPU
            // time): a process that did not get the CPU at all, or a target that
            // was idle but waited for a core to answer, answers late too.
            let now = Monotonic.now()
            let continued = StopWitness.latestContinue(after: since, waitingAtMost: min(thresholdTicks, 500_000_000))
            let sample = lastSample(gathered)
            let verdict = DetectorMachine.missedVerdict(
                duration: duration, now: now, threshold: thresholdTicks, continued: continued,
                debugged: !reportsWhileDebugged && isTraced(), processRan: processRan, sampled: sample != nil,
                waitedForCore: waitedForCore)
            guard verdict == .reported else { return traceMissed(duration, verdict.rawValue) }
            let backtrace =
                sample ?? (processRan || waitedForCore == nil ? Self.unsampledMissedStall : Self.unsampledAsleep)
            traceMissed(duration, "reported")
            let waited = state.withLock { $0.lastLookWaited }
            for phase in [StallEvent.Phase.started, .ended] {
                var event = makeEvent(
                    id: id, phase: phase, duration: duration, backtrace: backtrace, sampling: 0,
                    profile: (profile, activities))
                if phase == .started {
                    event.lateness = lateness(
                        duration: duration, sampling: 0, lookWaited: waited, second: false, afterEnd: true)
                }
                outlet.publish(event)
            }
        }
    }

    private func traceMissed(_ duration: Int64, _ verdict: String) {
        if SamplingTrace.isEnabled { SamplingTrace.missed(duration: duration, verdict) }
    }

    /// A missed stall's stack when no sample showed the target's job while it
    /// lasted.
    static let unsampledMissedStall = StallBacktrace.unavailable(
        "no sample of the target's job was finished before the stall ended (the detector's threads waited for a core, or its sample was still under way); the process used over a quarter of a core meanwhile"
    )

    /// A missed stall's stack when no sample was taken of a target whose
    /// thread did not wait for a core (asleep in its own job, say) while the
    /// detector's threads got none to sample it.
    static let unsampledAsleep = StallBacktrace.unavailable(
        "no sample of the target's job was finished before the stall ended (the detector's threads waited for a core); the answering thread did not wait for one for most of the stall"
    )

    /// The last sample a session took, named: a missed stall's stack.
    private func lastSample(_ gathered: StallProfiler.Gathered?) -> StallBacktrace? {
        guard let last = gathered?.recorder.samples.last, last.frames != StallProfiler.unsampledRaw else { return nil }
        // A profile's marker of cut awaits is said as a report says it.
        let frames = sampling.names([last.frames.filter { !$0.isAwaitsCut }])[0]
        let cut = last.frames.first(where: \.isAwaitsCut).map { AsyncContextChain.Cut.reason(code: $0.address) }
        return StallBacktrace(frames: frames, threadID: nil, unavailableReason: nil, awaitsCut: cut)
            .naming(gathered?.task)
    }

    // MARK: Looks (on the detector's thread)

    private func look(generation: UInt64) {
        warmUpOnce()
        // The moment this look is about. Read before asking the witness: a stop that
        // ends before it is then always seen, and one that starts after it does not
        // concern this look.
        let now = Monotonic.now()
        // Was the process stopped since the detector last looked? (May wait for the
        // witness to record a continue it has not had the CPU to record yet.) A
        // stale look asks nothing: the witness's files stay closed between stalls.
        let current = state.withLock { $0.lookGeneration == generation ? $0.machine.lastContinueSeen : nil }
        guard let since = current else { return }
        let continued = StopWitness.latestContinue(after: since, waitingAtMost: min(thresholdTicks, 500_000_000))
        let (look, change) = state.withLock { state -> (DetectorMachine.Look, LookChange) in
            guard generation == state.lookGeneration else { return (.nothing, LookChange()) }
            state.lastLookWaited = max(0, now - state.lookDue)
            let (look, plan) = state.machine.look(now: now, continued: continued, answering: answers.any)
            return (look, apply(plan, &state))
        }
        if SamplingTrace.isEnabled && look != .nothing {
            SamplingTrace.probe("look", at: now, late: state.withLock { $0.lastLookWaited })
        }
        // The replaced look is cancelled here, on the detector's thread (the one
        // running now, this one, returns at once).
        carryOut(change, onDetectorThread: true)
        switch look {
        case .nothing: return
        case .stallGoesOn: profiler.refreshFatalReport(now: now)
        case .sample(let decision): sampleAndReport(decision, now: now)
        }
    }

    /// Whether the sampled thread could run when sampled: the sampler signalled
    /// it (as it does a runnable thread), or it is runnable now. Read only
    /// where the confirmation rule asks (a custom executor's thread).
    private func sampledThreadRunnable(_ sample: StallBacktrace, _ signalled: Bool) -> Bool {
        guard !signalled else { return true }
        guard case .custom = target else { return false }
        return ThreadState.letter(thread: Int32(truncatingIfNeeded: sample.threadID ?? 0)) == "R"
    }

    /// The thread that answered last, as a look that found no job sees it.
    private func executorThread(_ thread: Int32) -> DetectorMachine.ExecutorThread? {
        guard let schedule = ProcessFacts.schedule(ofThread: thread), let runnable = ProcessFacts.isRunnable(thread)
        else { return nil }
        return DetectorMachine.ExecutorThread(thread: thread, runnable: runnable, ran: schedule.ran)
    }

    /// Samples a stall the look found, and emits what that leads to.
    private func sampleAndReport(_ decision: DetectorMachine.Decision, now: Int64) {
        let suppressed = decision.suppressed ?? (!reportsWhileDebugged && isTraced())
        let sampleStart = Monotonic.now()
        var reported = StallBacktrace.unavailable("not sampled: a debugger is attached")
        var samples: [Int32: StallBacktrace] = [:]
        var seen: Int64?
        var signalled = false
        var answering = false
        let (lastAnswering, queue) = state.withLock {
            ($0.machine.lastAnsweringThread, $0.machine.lastAnsweringQueue)
        }
        if !suppressed {
            // A watched queue's or the main queue's drainer is found with the
            // profiler's sampler (its unwinds share the calls the profile decoded);
            // other targets are searched with this context (the profiler's queue,
            // entered with `sync` from here, lost a `.custom` target's blocked thread
            // in a fresh process: not traced yet).
            let search =
                target.ownsProbeQueue
                ? profiler.findBlockedThread(lastAnswering: lastAnswering, queue: queue)
                : sampling.find(target: target, lastAnswering: lastAnswering, queue: queue, candidatesOnly: false)
            // Awaiting callers not named yet are named from their symbols: the
            // report is not held up by reading their modules' debug information.
            let blocked = sampling.named(search, awaitsInFull: false)
            (reported, samples, seen) = (blocked.backtrace, blocked.samples, search.found?.time)
            signalled = search.found?.signalled ?? false
            answering = search.answeringProbe
            profiler.stallStarted(
                backtrace: reported, activities: blocked.activities, start: now - decision.duration, seen: seen,
                at: sampleStart)
        }
        let samplingTime = Monotonic.now() - sampleStart
        // A heartbeat target's stall is confirmed by a thread running a job (or by a
        // second look, unless the executor's thread only waited for a core since
        // the first); the main run loop's culprit is the main thread by definition.
        let jobSeen =
            suppressed || !target.usesHeartbeat
            || DetectorMachine.confirms(target, by: reported, runnable: sampledThreadRunnable(reported, signalled))
        let executor = jobSeen ? nil : lastAnswering.flatMap(executorThread)
        let (report, settled, endedAt) = state.withLock { state in
            let confirmed =
                jobSeen
                || state.machine.confirmsWithoutJob(decision, executor: executor, answering: answering)
            return state.machine.sampled(
                decision, reported: reported, samples: samples, seen: seen, samplingTime: samplingTime,
                confirmed: confirmed, suppressed: suppressed)
        }
        let gathered = settled ? profiler.end(until: endedAt) : nil
        switch report {
        case .nothing:
            return
        case .missed(let outcome):
            emit(outcome, gathered: gathered)
        case .events(let started, let ended):
            let profile =
                gathered.map { (profiler.profile(of: $0), $0.activities) } ?? profiler.snapshot(awaitsInFull: false)
            let sampled = Sampled(reported: started, samples: samples, time: samplingTime, profile: profile)
            deliver(events(decision, sampled, ended: ended), stallStart: now - decision.duration)
        }
    }

    /// What sampling a stall found: the reported stack, every thread sampled in the
    /// search, how long it took, and the profile so far.
    private struct Sampled {
        let reported: StallBacktrace
        let samples: [Int32: StallBacktrace]
        let time: Int64
        let profile: (StallProfile, [String])
    }

    /// A sampled stall's `.started` event, and its `.ended` one when the stall
    /// ended while it was sampled.
    private func events(
        _ decision: DetectorMachine.Decision, _ sampled: Sampled, ended: (duration: Int64, backtrace: StallBacktrace)?
    ) -> [StallEvent] {
        var started = makeEvent(
            id: decision.id, phase: .started, duration: decision.duration, backtrace: sampled.reported,
            sampling: sampled.time, profile: sampled.profile)
        started.lateness = lateness(
            duration: decision.duration, sampling: sampled.time, lookWaited: state.withLock { $0.lastLookWaited },
            second: decision.second, afterEnd: ended != nil)
        if case .cooperativePool = target {
            started.poolBacktraces =
                [sampled.reported]
                + sampled.samples.sorted { $0.key < $1.key }.map(\.value).filter {
                    $0.threadID != sampled.reported.threadID
                }
        }
        guard let ended else { return [started] }
        let end = makeEvent(
            id: decision.id, phase: .ended, duration: ended.duration, backtrace: ended.backtrace,
            sampling: sampled.time, profile: sampled.profile)
        return [started, end]
    }

    /// Yields events; a `.started` one is written as the fatal report, an `.ended`
    /// one removes it.
    private func deliver(_ events: [StallEvent], stallStart: Int64 = 0) {
        for event in events {
            outlet.publish(event)
            switch event.phase {
            case .started: profiler.stallReported(event, start: stallStart, at: Monotonic.now())
            case .ended: profiler.fatal?.remove()
            }
        }
    }

    /// How late a `.started` event is (``StallEvent/Lateness``), or nil when on time.
    private func lateness(
        duration: Int64, sampling: Int64, lookWaited: Int64, second: Bool, afterEnd: Bool
    ) -> StallEvent.Lateness? {
        StallEvent.Lateness(
            stallDuration: .nanoseconds(duration), threshold: threshold, heartbeat: .nanoseconds(heartbeatTicks),
            sampling: .nanoseconds(sampling), lookWaited: .nanoseconds(lookWaited), confirmedBySecondLook: second,
            reportedAfterEnd: afterEnd)
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

}
