/// The decisions of one ``StallDetector``, as a pure state machine: each input
/// carries its time and the facts the detector read outside its lock (a continue
/// the ``StopWitness`` saw, a sample, whether a debugger is attached), and each
/// output says what the detector must do next: what to do with its next look,
/// whether to sample, what to emit. No clock, no timers, no `/proc`, no threads:
/// `DetectorCore` owns those, asks this machine under its lock, and acts after.
///
/// A stall goes through these phases: a look finds the target overdue
/// (``look(now:continued:answering:)`` returns ``Look/sample(_:)``); the detector samples
/// it and says what it saw (``sampled(_:reported:samples:samplingTime:confirmed:suppressed:)``):
/// confirmed, `.started` is emitted; not confirmed (no thread was running the
/// target's job), the next look samples it again and reports it if it still
/// owes. The answer that finally comes (``answered(at:thread:queue:)``, or
/// run-loop ``activity(at:idle:)``) ends it.
struct DetectorMachine: Sendable {
    enum Lifecycle: Equatable, Sendable { case idle, running, stopped }

    /// What to do with the detector's look (the one-shot timer that runs when the
    /// target would be overdue).
    enum LookPlan: Equatable, Sendable {
        /// Leave the armed look as it is.
        case keep
        /// Push the armed look back to `timeout` from now; arm a new one when it
        /// cannot be moved (it is running, or was armed with another timeout).
        case move(timeout: Int64)
        /// Replace the armed look (the one running now, if any) with a new one.
        case arm(timeout: Int64)
        /// No look: nothing is owed.
        case drop
    }

    /// What a beat of the shared ``Heartbeat`` asks of the detector: whether to
    /// post a probe (none is outstanding; the slot is taken), and what to do
    /// with the look (`.keep`, or `.arm` when an answer would be overdue before
    /// the next beat and no look is armed).
    struct BeatPlan: Equatable, Sendable {
        var post: Bool
        var look: LookPlan
        /// The threads whose schedules to read now, for the answer owed since
        /// `owedSince` (``schedulesRead(_:forAnswerOwedSince:)``): the threads that
        /// answered last, the latest first (a queue's answer may run on any of
        /// the pool's workers), one of which the look armed now may see answer.
        var readSchedules: (threads: [Int32], owedSince: Int64)? = nil

        static func == (left: BeatPlan, right: BeatPlan) -> Bool {
            left.post == right.post && left.look == right.look
                && left.readSchedules?.threads == right.readSchedules?.threads
                && left.readSchedules?.owedSince == right.readSchedules?.owedSince
        }
    }

    /// What a look decided: nothing to do, a stall goes on (the fatal report may
    /// be due), or a stall to sample.
    enum Look: Equatable, Sendable {
        case nothing
        case stallGoesOn
        case sample(Decision)
    }

    /// A stall to sample: its id, how long it has lasted, whether this is the
    /// second look at it, and whether its events are suppressed (a debugger is
    /// attached): known from the first look on, nil for the first look itself.
    struct Decision: Equatable, Sendable {
        var id: UInt64
        var duration: Int64
        var suppressed: Bool?
        var second: Bool
    }

    /// What an answer, an activity or a sample concluded: a reported stall
    /// ended, or a stall no look confirmed in time has come and gone (reported
    /// only with evidence that the target ran its own code meanwhile).
    enum Outcome: Sendable {
        case ended(id: UInt64, duration: Int64, backtrace: StallBacktrace, sampling: Int64)
        /// `processRan`: no sample confirmed the stall (no look saw it in time,
        /// or the one look's sample found no thread running the target's job),
        /// and the process used at least a quarter of a core while it lasted
        /// (``processRan(cpu:over:)``): the detector was late for the process's
        /// own work, not because the process got no CPU (stopped, or starved by
        /// other processes). `waitedForCore`: how long of the stall the answering
        /// thread waited on a run queue for a core (its `schedstat` run delay
        /// since a look was armed for this answer), when it was the thread that
        /// answered before (``missedIsStall(duration:threshold:processRan:sampled:waitedForCore:)``).
        case missed(id: UInt64, duration: Int64, since: Int64, processRan: Bool = false, waitedForCore: Int64? = nil)
    }

    /// What the sample of a stall leads to.
    enum Report: Sendable {
        case nothing
        /// `.started` with the stack it shows, and `.ended` too if the stall
        /// ended while it was sampled.
        case events(started: StallBacktrace, ended: (duration: Int64, backtrace: StallBacktrace)?)
        /// Not confirmed, and ended while sampled.
        case missed(Outcome)
    }

    /// The result of an answer or an activity: its outcome, the look, and
    /// whether no stall is open any more (the profile of the last one ends).
    struct Step: Sendable {
        var outcome: Outcome?
        var look: LookPlan
        var settled: Bool
        /// How long the answer or activity came after it was owed (the lag the
        /// detector's histogram records); nil when nothing was owed.
        var lag: Int64?
    }

    private struct OpenStall {
        enum Phase {
            /// `.started` is being sampled.
            case sampling
            /// The first sample found no thread running a job for the target: the
            /// target may just not have had the CPU yet. The next look, a
            /// heartbeat later, samples again and reports it if it still owes.
            case awaitingConfirmation
            /// `.started` was emitted.
            case reported
        }

        var id: UInt64
        var samples: [Int32: StallBacktrace] = [:]
        var reported: StallBacktrace = .unavailable("not sampled yet")
        var suppressed = false
        var sampling: Int64 = 0
        /// `.ended` arrived while `.started` was still being sampled.
        /// The answer that ended the stall while it was sampled: how long it lasted,
        /// when it ended, the answering thread, whether the process ran meanwhile.
        var endedWhileSampling: (duration: Int64, at: Int64, thread: Int32?, processRan: Bool, waited: Int64?)?
        var phase = Phase.sampling
        /// The executor's thread as the last look that found no job saw it
        /// (``confirmsWithoutJob(_:executor:answering:)``).
        var executor: ExecutorThread?
    }

    /// The thread that answered last, at a look whose sample found no job: whether
    /// it was runnable (running, or waiting for a core), and its time on a core
    /// in all, in nanoseconds.
    struct ExecutorThread: Equatable, Sendable {
        var thread: Int32
        var runnable: Bool
        var ran: Int64
    }

    let threshold: Int64
    let heartbeat: Int64
    /// A heartbeat target (probes answer); false for the main run loop (an observer).
    let usesHeartbeat: Bool
    private(set) var lifecycle = Lifecycle.idle
    private(set) var tracker: StallTracker
    /// The start of the heartbeat's grid.
    private var probeGridStart: Int64 = 0
    private(set) var lastAnsweringThread: Int32?
    /// The distinct threads that answered last, the latest first, at most
    /// ``rememberedAnsweringThreads``.
    private var recentAnsweringThreads: [Int32] = []
    /// How many answering threads ``BeatPlan/readSchedules`` names: a serial
    /// queue's answers run on whichever of the pool's workers is free.
    static let rememberedAnsweringThreads = 8
    /// The serial queue the last probe ran on (the watched queue's address).
    private(set) var lastAnsweringQueue: UInt?
    /// A probe is outstanding: it has neither run nor been released.
    private var probeOutstanding = false
    /// Whether ``watch(from:inRunLoopPass:cpu:gridStart:)`` has set the
    /// detector up: beats before it find nothing to do.
    private var watching = false
    /// Whether the answer owed now is owed from the timer's grid point, as
    /// assumed after an answer, rather than from a probe really handed to the
    /// target (``posted(at:)``).
    private var owedFromGrid = false
    /// The last moment the detector saw the process run (answers, looks).
    private var lastObservation: Int64
    /// The latest continue after a stop that a look has taken into account.
    private(set) var lastContinueSeen: Int64 = 0
    /// The process's CPU time when the outstanding probe was posted (or at the
    /// last answer that carried it, or at the start), and when.
    private var lastAnswerCPU: (time: Int64, cpu: Int64)?
    /// The schedules (``schedulesRead(_:forAnswerOwedSince:)``) of the threads
    /// that answered last, read when a look was armed for the next answer.
    private var scheduleBaselines: [Int32: ProcessFacts.Schedule] = [:]
    private var open: OpenStall?
    /// How many beats pass between two probes (more than one while the target
    /// answers promptly, up to the detector's idle heartbeat).
    private(set) var spacing: ProbeSpacing

    /// `queue`: the address of the serial queue the target owns, when known
    /// before any answer (``lastAnsweringQueue`` until the first one).
    /// `widestSpacing`: the most beats between two probes (``ProbeSpacing``).
    init(
        threshold: Int64, heartbeat: Int64, usesHeartbeat: Bool, now: Int64, queue: UInt? = nil,
        widestSpacing: Int64 = 1
    ) {
        self.threshold = threshold
        self.heartbeat = heartbeat
        self.usesHeartbeat = usesHeartbeat
        self.spacing = ProbeSpacing(widest: widestSpacing)
        self.lastAnsweringQueue = queue
        self.tracker = StallTracker(threshold: threshold, now: now)
        self.lastObservation = now
    }

    /// The look's timeout while the run loop is busy: from an activity to the
    /// moment the next one is overdue. (Heartbeat targets arm their looks at
    /// beats, for the moment the answer owed would be overdue.)
    var healthyLookTimeout: Int64 { threshold }

    /// Whether the target owes an answer and no stall is open: the profiler
    /// samples ahead of the threshold while this holds. A probe not handed over
    /// yet is owed by nobody.
    var owesAnswer: Bool {
        lifecycle == .running && !tracker.isStalled && tracker.dueTime != nil && !awaitingHandOver
    }

    /// Where the detector stands for a caller that is about to stop it and must
    /// not lose a stall (a test's stall guard).
    enum Settlement: Sendable, Equatable {
        /// No stall is being sampled, none is going on, and no answer is owed
        /// for `threshold` or longer: a stop now loses nothing.
        case settled
        /// A stall's `.started` is being sampled: a stop now would end it
        /// with nothing.
        case sampling
        /// A reported stall goes on, or an answer has been owed for `threshold` or
        /// longer (a stall the looks have not seen yet, or one whose answer is
        /// on its way).
        case overdue
    }

    func settlement(now: Int64) -> Settlement {
        if let open { return open.phase == .reported ? .overdue : .sampling }
        guard lifecycle == .running, !awaitingHandOver, let owed = tracker.pendingSince else { return .settled }
        return now - owed >= threshold ? .overdue : .settled
    }

    // MARK: Lifecycle

    /// Idle to running; false when the detector was started or stopped before.
    mutating func begin() -> Bool {
        guard lifecycle == .idle else { return false }
        lifecycle = .running
        return true
    }

    /// The detector is set up at `now`: the first probe is sent at the first
    /// beat after `now` of the heartbeat whose grid counts from `gridStart` (nil:
    /// from `now`), or the run loop is busy from now (`start()` was called inside
    /// a pass). `cpu` is the process's CPU time at `now`, if read: a stall the
    /// first answer ends is weighed against it like any later one. Nil when the
    /// detector was stopped meanwhile.
    mutating func watch(
        from now: Int64, inRunLoopPass: Bool, cpu: Int64? = nil, gridStart: Int64? = nil
    ) -> LookPlan? {
        guard lifecycle == .running else { return nil }
        watching = true
        tracker = StallTracker(threshold: threshold, now: now)
        lastObservation = now
        lastContinueSeen = now
        lastAnswerCPU = cpu.map { (now, $0) }
        if usesHeartbeat {
            probeGridStart = min(gridStart ?? now, now)
            tracker.probeSent(at: nextProbe(after: now))
            owedFromGrid = true
        } else if inRunLoopPass {
            _ = tracker.progress(at: now, busyAfterwards: true)
        }
        return !usesHeartbeat && inRunLoopPass ? .arm(timeout: healthyLookTimeout) : .keep
    }

    /// Running to stopped at `now`: whether it was running, and the `.ended` of
    /// the stall the stop cuts short, if one is reported (its `.started` was
    /// emitted) and has not ended: `duration` is the time the target had been
    /// blocked until `now`. A stall not yet reported (being sampled, or awaiting
    /// its second look) emitted nothing, and ends with nothing.
    mutating func stop(at now: Int64) -> (wasRunning: Bool, cutShort: Outcome?) {
        let wasRunning = lifecycle == .running
        lifecycle = .stopped
        let stall = open
        open = nil
        guard wasRunning, let stall, stall.phase == .reported, !stall.suppressed,
            let tracked = tracker.stall, tracked.id == stall.id
        else { return (wasRunning, nil) }
        let ended = Outcome.ended(
            id: stall.id, duration: max(0, now - tracked.start), backtrace: stall.reported, sampling: stall.sampling)
        return (true, ended)
    }

    // MARK: Beats and probes

    /// A beat of the shared heartbeat ran at `time`; the next is due at `next`;
    /// `cpu` is the process's CPU time at `time`. `lookArmed`: whether a look
    /// is armed now. Nil when the detector is not watching.
    ///
    /// A probe is posted unless one is outstanding (a blocked target gets one
    /// probe, not a pile); the CPU time then is what a late answer to it is
    /// weighed against. The answer is owed from the moment the probe is handed
    /// to the target (``posted(at:)``), not from the beat. The look is armed
    /// only when the answer owed would be overdue before the next beat, or the
    /// last probe is still unanswered at this beat: while the target answers,
    /// no look is armed at all.
    mutating func beat(
        at time: Int64, next: Int64, cpu: Int64?, lookArmed: Bool
    ) -> BeatPlan? {
        guard lifecycle == .running, watching, usesHeartbeat else { return nil }
        let outstanding = probeOutstanding
        // A probe unanswered for a beat: probe every beat again.
        if outstanding { spacing.narrow() }
        let posts = !outstanding && isProbeDue(at: time)
        if posts {
            probeOutstanding = true
            if let cpu { lastAnswerCPU = (time, cpu) }
        }
        guard !lookArmed, open == nil, let due = tracker.dueTime, outstanding || due <= next else {
            return BeatPlan(post: posts, look: .keep)
        }
        scheduleBaselines = [:]
        let read = recentAnsweringThreads.isEmpty ? nil : tracker.pendingSince.map { (recentAnsweringThreads, $0) }
        return BeatPlan(post: posts, look: .arm(timeout: max(0, due - time)), readSchedules: read)
    }

    /// The earliest moment a late answer is counted from, before the profiler
    /// samples ahead of the threshold: a beat before the point the answer owed
    /// is owed from. Every beat posting a probe, that is about the last answer;
    /// with probes spaced wider, the last answer came beats before the probe
    /// owed was posted, and counting from it would sample an idle target.
    var lateCountedFrom: Int64? {
        usesHeartbeat ? tracker.pendingSince.map { $0 - heartbeat } : nil
    }

    /// Whether a beat at `time` posts the next probe: the answer owed is owed
    /// from its grid point, or from a point before it (or less than half a beat
    /// after it: a timer may fire a little early). While the probes are spaced
    /// wider than a beat, the beats in between post nothing.
    private func isProbeDue(at time: Int64) -> Bool {
        guard owedFromGrid, let owed = tracker.pendingSince else { return true }
        return time >= owed - heartbeat / 2
    }

    /// The schedules of threads (their time on a core and waiting for one, in
    /// all), read after a beat armed a look for the answer owed since
    /// `owedSince`; ignored when that answer came meanwhile. A thread waiting
    /// for a core when it was read does not count that wait yet: the kernel
    /// adds it once the thread runs.
    mutating func schedulesRead(
        _ schedules: [(thread: Int32, schedule: ProcessFacts.Schedule)], forAnswerOwedSince owedSince: Int64
    ) {
        guard lifecycle == .running, tracker.pendingSince == owedSince else { return }
        for (thread, schedule) in schedules where recentAnsweringThreads.contains(thread) {
            scheduleBaselines[thread] = schedule
        }
    }

    /// Whether a first sample confirms a heartbeat target's stall at once: a
    /// dispatch queue's by a thread running a job; the cooperative pool's by a
    /// pool thread held in a job; a custom executor's by the thread that last
    /// ran a probe doing anything but waiting for work: neither parked, nor
    /// woken from a wait and not run since (`runnable`: it could run when
    /// sampled, see ``SamplingContext/isWokenWaiter(_:runnable:)``).
    static func confirms(_ target: StallDetector.Target, by sample: StallBacktrace, runnable: Bool) -> Bool {
        switch target {
        case .cooperativePool:
            return sample.unavailableReason == nil && StackShape.holdsPoolThread(sample.frames)
        case .custom:
            let thread = Int32(truncatingIfNeeded: sample.threadID ?? 0)
            return sample.unavailableReason == nil && !SamplingContext.isIdle(sample, thread: thread)
                && !SamplingContext.isWokenWaiter(sample, runnable: runnable)
        default:
            return StackShape.runsJob(sample.frames)
        }
    }

    /// What becomes of a stall no look confirmed (``Outcome/missed``), weighed
    /// with what was read once it had ended.
    enum MissedVerdict: String, Sendable {
        /// The process was stopped meanwhile (a continue came after it began).
        case stopped
        /// A debugger is attached and such stalls are not reported.
        case debugged
        /// Nothing shows that the target ran its own code meanwhile.
        case noEvidence = "no-evidence"
        /// The answering thread waited for a core for most of it.
        case waitedForCore = "waited-for-core"
        /// A stall: reported (`.started` and `.ended` at once).
        case reported
    }

    /// The verdict on a stall no look confirmed, `duration` long and ended at
    /// `now`: `continued` is the latest continue the stop witness saw since it
    /// began (nil: none), `debugged` whether a debugger is attached while such
    /// stalls are not reported; the rest as for
    /// ``missedIsStall(duration:threshold:processRan:sampled:waitedForCore:)``.
    /// A stop comes first (its time is no stall of the target's), then the
    /// debugger, then the evidence.
    static func missedVerdict(
        duration: Int64, now: Int64, threshold: Int64, continued: Int64?, debugged: Bool, processRan: Bool,
        sampled: Bool, waitedForCore: Int64?
    ) -> MissedVerdict {
        if let continued, continued >= now - duration { return .stopped }
        if debugged { return .debugged }
        guard
            missedIsStall(
                duration: duration, threshold: threshold, processRan: processRan, sampled: sampled,
                waitedForCore: waitedForCore)
        else { return waitedForCore == nil ? .noEvidence : .waitedForCore }
        return .reported
    }

    /// Whether a stall no look confirmed is reported: with a known wait for a
    /// core, when the thread was held up by its own work (the stall less that
    /// wait) for at least the threshold, sampled or not; otherwise when a
    /// sample showed the target's job, or the process ran (at least a quarter
    /// of a core) while it lasted. An idle event loop woken by the probe that
    /// waited 250 ms for a core is no stall of its own; a loop asleep in its
    /// own job, on a machine where the detector's threads got no core to
    /// sample it, is one.
    static func missedIsStall(
        duration: Int64, threshold: Int64, processRan: Bool, sampled: Bool, waitedForCore: Int64?
    ) -> Bool {
        if let waitedForCore { return duration - waitedForCore >= threshold }
        return sampled || processRan
    }

    /// How long the answer at `time` waited for a core on `thread`, as far as
    /// the stall is weighed (``missedIsStall(duration:threshold:processRan:sampled:waitedForCore:)``):
    /// its wait since the schedule read when the look for it was armed; or, for
    /// a thread younger than the wait for the answer (a worker the pool started
    /// for it), all its wait. 0 when the thread also ran for half the threshold
    /// meanwhile: it was running a job of its own, and its waits were that
    /// job's, preempted on a crowded machine (8 spinning queues on 2 busy
    /// cores), not an idle thread's wait to answer. Nil when neither is known
    /// (no look was armed, the thread is older and was not read, or its counts
    /// went back).
    private func waitedForCore(
        at time: Int64, thread: Int32?, schedule: ProcessFacts.Schedule?, threadAge: Int64?
    ) -> Int64? {
        guard let thread, let schedule else { return nil }
        let since: ProcessFacts.Schedule
        if let baseline = scheduleBaselines[thread] {
            since = ProcessFacts.Schedule(ran: schedule.ran - baseline.ran, waited: schedule.waited - baseline.waited)
        } else if let threadAge, let owedSince = tracker.pendingSince, threadAge <= time - owedSince {
            since = schedule
        } else {
            return nil
        }
        guard since.ran >= 0, since.waited >= 0 else { return nil }
        return since.ran >= threshold / 2 ? 0 : since.waited
    }

    /// A probe was handed to the target at `time` (a posted probe: `.custom`,
    /// the cooperative pool). An answer owed only from the timer's grid point
    /// is owed from this moment when it is later: the detector's own threads
    /// posted late (they waited for a core), and that time was not the target's.
    mutating func posted(at time: Int64) {
        guard lifecycle == .running, owedFromGrid else { return }
        owedFromGrid = false
        tracker.probePosted(at: time, heartbeat: heartbeat)
    }

    /// The probe ran or was released unrun: the next beat may post.
    mutating func releaseProbeSlot() {
        probeOutstanding = false
    }

    /// Whether the answer owed is owed only from a point of the heartbeat's grid:
    /// the probe for it has not been handed to the target yet.
    private var awaitingHandOver: Bool { usesHeartbeat && owedFromGrid && !tracker.isStalled }

    /// Whether an answer at `time` may end or miss a stall, and so needs the
    /// process's CPU time (``processRan(cpu:over:)``): a stall is open, or the
    /// answer comes within a heartbeat of being overdue or later. A prompt
    /// answer needs none (its probe's beat read it for the next late one).
    func needsCPU(at time: Int64) -> Bool {
        guard lifecycle == .running else { return false }
        if open != nil || tracker.isStalled { return true }
        guard let due = tracker.dueTime else { return false }
        return time >= due - heartbeat
    }

    // MARK: Facts from the target

    /// A probe answered at `time`, on `thread` (and serial `queue`, if known);
    /// `cpu` is the process's CPU time then, if read; `schedule` and
    /// `threadAge`, that thread's time on and waiting for a core in all and how
    /// long it has existed, if read (``waitedForCore(at:thread:schedule:threadAge:)``).
    mutating func answered(
        at time: Int64, thread: Int32?, queue: UInt?, cpu: Int64? = nil, schedule: ProcessFacts.Schedule? = nil,
        threadAge: Int64? = nil
    ) -> Step? {
        guard lifecycle == .running else { return nil }
        let waitedForCore = waitedForCore(at: time, thread: thread, schedule: schedule, threadAge: threadAge)
        scheduleBaselines = [:]
        lastAnsweringThread = thread
        if let thread, recentAnsweringThreads.first != thread {
            recentAnsweringThreads.removeAll { $0 == thread }
            recentAnsweringThreads.insert(thread, at: 0)
            if recentAnsweringThreads.count > Self.rememberedAnsweringThreads { recentAnsweringThreads.removeLast() }
        }
        lastAnsweringQueue = queue
        lastObservation = max(lastObservation, time)
        let ran = cpu.flatMap { cpu in
            lastAnswerCPU.map { Self.processRan(cpu: cpu - $0.cpu, over: time - $0.time) }
        }
        if let cpu { lastAnswerCPU = (time, cpu) }
        let lag = tracker.pendingSince.map { waited(until: time, owedFrom: $0) }
        let outcome = finish(
            tracker.progress(at: time), at: time, thread: thread, processRan: ran ?? false, waited: waitedForCore)
        if outcome == nil, open == nil {
            spacing.answered(lag: lag, heartbeat: heartbeat)
        } else {
            spacing.narrow()
        }
        let next = nextProbe(after: time)
        tracker.probeSent(at: next, startNotBefore: next - heartbeat)
        owedFromGrid = true
        // A look armed for this answer's lateness (or a stall's) has nothing left
        // to see: the beats arm the next when the next answer nears its due time.
        return Step(outcome: outcome, look: .drop, settled: open == nil, lag: lag)
    }

    /// The main run loop moved on at `time` (busy from then on), or went to sleep.
    mutating func activity(at time: Int64, idle: Bool) -> Step? {
        guard lifecycle == .running else { return nil }
        lastObservation = max(lastObservation, time)
        let lag = tracker.pendingSince.map { time - $0 }
        let event = idle ? tracker.idle(at: time) : tracker.progress(at: time, busyAfterwards: true)
        let outcome = finish(event, at: time, thread: nil)
        return Step(
            outcome: outcome, look: idle ? .keep : .move(timeout: healthyLookTimeout), settled: open == nil, lag: lag)
    }

    /// Whether the process used at least a quarter of a core over `wall`
    /// nanoseconds in which it used `cpu` nanoseconds of CPU. A process that was
    /// stopped, or starved by other processes (nice 19 beside busy ones used
    /// under 2 % of a core), answers late too without a stall of its own.
    static func processRan(cpu: Int64, over wall: Int64) -> Bool {
        wall > 0 && cpu >= wall / 4
    }

    /// How long an answer at `time` waited, when the next answer is owed from
    /// `owed`. One before that point answers a probe posted before it (with one
    /// probe outstanding at a time and the owed time moved to each hand-over,
    /// this is rare): it was due at the last grid point before it, not never.
    private func waited(until time: Int64, owedFrom owed: Int64) -> Int64 {
        guard time < owed, heartbeat > 0 else { return time - owed }
        return time - lastProbe(atOrBefore: time)
    }

    /// The point of the timer's grid at or before `time`.
    private func lastProbe(atOrBefore time: Int64) -> Int64 {
        probeGridStart + max(0, time - probeGridStart) / heartbeat * heartbeat
    }

    /// The next probe after an answer at `time`: the next point of the timer's
    /// grid, or a later one while the probes are spaced wider (``spacing``).
    private func nextProbe(after time: Int64) -> Int64 {
        lastProbe(atOrBefore: time) + spacing.beats * heartbeat
    }

    /// The outcome of a tracker event for the open stall, if any.
    private mutating func finish(
        _ event: StallTracker.Event?, at time: Int64, thread: Int32?, processRan: Bool = false, waited: Int64? = nil
    ) -> Outcome? {
        if case .missed(let id, let duration) = event {
            return .missed(
                id: id, duration: duration, since: lastContinueSeen, processRan: processRan, waitedForCore: waited)
        }
        guard case .ended(let id, let duration) = event, var stall = open, stall.id == id else { return nil }
        switch stall.phase {
        case .sampling:
            // The sample under way emits both events.
            stall.endedWhileSampling = (duration, time, thread, processRan, waited)
            open = stall
            return nil
        case .awaitingConfirmation:
            // Answered before a second look: a missed stall, reported if the
            // profile's samples saw the target's job running meanwhile, or the
            // process ran (the sample found no job: a running thread that got no
            // core to answer its signal on a loaded machine).
            open = nil
            return stall.suppressed
                ? nil
                : .missed(
                    id: id, duration: duration, since: lastContinueSeen, processRan: processRan, waitedForCore: waited)
        case .reported:
            open = nil
            if stall.suppressed { return nil }
            let backtrace = Self.endedBacktrace(answeredBy: thread, samples: stall.samples, reported: stall.reported)
            return .ended(id: id, duration: duration, backtrace: backtrace, sampling: stall.sampling)
        }
    }

    /// The stack an `.ended` event shows: the sample of the thread that answered,
    /// unless it was idle then (a `queue.sync` caller blocks, a worker answers);
    /// never an idle stack in place of the one `.started` reported.
    static func endedBacktrace(
        answeredBy thread: Int32?, samples: [Int32: StallBacktrace], reported: StallBacktrace
    ) -> StallBacktrace {
        guard let thread, let sample = samples[thread], !StackShape.looksIdle(sample.frames) else { return reported }
        return sample
    }

    // MARK: Looks

    /// The look that was due ran at `now`; `continued` is the latest continue
    /// after a stop the witness recorded since ``lastContinueSeen``, if any.
    /// `answering`: an answer had read its time when this look read `now`,
    /// and is not recorded yet (``AnswersUnderWay``).
    ///
    /// Such an answer may have come before `now`: the target was not blocked
    /// then, whatever the machine still owes. The look neither opens a stall
    /// nor reports an unconfirmed one; the answer, recorded in a moment, drops
    /// this look or ends what is open (no `.ended` shorter than its
    /// `.started`, none under the threshold). Should it be held up, the look
    /// comes again a heartbeat later.
    mutating func look(now: Int64, continued: Int64?, answering: Bool = false) -> (Look, LookPlan) {
        guard lifecycle == .running else { return (.nothing, .keep) }
        if let continued, continued > lastContinueSeen {
            // Owed answers are owed afresh from this look, the first since the
            // continue: a process that gets the CPU late after a stop (a loaded
            // machine) is not stalled for that.
            tracker.continued(at: max(continued, now), lastObservation: lastObservation)
            lastContinueSeen = continued
        }
        lastObservation = max(lastObservation, now)
        if open == nil, awaitingHandOver {
            // The probe owed has not reached the target yet (the beat that
            // posts it is late): the target was not asked, whatever the time.
            // The beat that hands it over arms the next look.
            return (.nothing, .drop)
        }
        if answering, open?.phase == .awaitingConfirmation || tracker.dueTime.map({ now >= $0 }) == true {
            return (.nothing, .arm(timeout: heartbeat))
        }
        if var stall = open, stall.phase == .awaitingConfirmation, let start = tracker.stall?.start {
            // The second look at an unconfirmed stall: the target still owes.
            stall.phase = .sampling
            open = stall
            let decision = Decision(id: stall.id, duration: now - start, suppressed: stall.suppressed, second: true)
            return (.sample(decision), .arm(timeout: heartbeat))
        }
        guard case .started(let id, let duration) = tracker.tick(now: now) else {
            if tracker.isStalled { return (.stallGoesOn, .arm(timeout: heartbeat)) }
            return (.nothing, nextLook(now: now))
        }
        open = OpenStall(id: id)
        // While the stall lasts, look every heartbeat, so that a stop during it
        // is measured within a heartbeat.
        return (.sample(Decision(id: id, duration: duration, suppressed: nil, second: false)), .arm(timeout: heartbeat))
    }

    /// The look after one that found nothing overdue at `now`: for a heartbeat
    /// target, at the due time if it comes before the next beat (later ones are
    /// armed by the beats); for the run loop, a threshold on while anything is
    /// owed.
    private func nextLook(now: Int64) -> LookPlan {
        guard let due = tracker.dueTime else { return .drop }
        guard usesHeartbeat else { return .arm(timeout: healthyLookTimeout) }
        return due - now < heartbeat ? .arm(timeout: max(0, due - now)) : .drop
    }

    /// Whether a look whose sample found no thread running the target's job
    /// confirms the stall of `decision`: the second look does (the target still
    /// owes its answer a heartbeat after the first look found no job), unless
    /// the thread that answered last was runnable at both looks and ran under a
    /// millisecond in between. That is an idle executor woken by its probe that
    /// waits for a core on a crowded machine (a loop at nice 19 beside threads
    /// busy on every core waited 0.76 s, and was reported twice in 3 spells
    /// without a stack): the next look asks again, and the answer, when it
    /// comes, is weighed as a stall no look confirmed
    /// (``missedIsStall(duration:threshold:processRan:sampled:waitedForCore:)``).
    /// A thread asleep, or one that ran, confirms it as before. A look whose
    /// sample found the target's thread `answering` a probe never confirms: the
    /// target answered (a starved loop at nice 19, sampled as it ran the probe
    /// it had waited 0.75 s of CPU for, was reported as a stall with "the
    /// stall it answers was over" for its stack); the answer, when it arrives,
    /// is weighed as above.
    mutating func confirmsWithoutJob(_ decision: Decision, executor: ExecutorThread?, answering: Bool = false) -> Bool {
        guard lifecycle == .running, var stall = open, stall.id == decision.id else { return decision.second }
        let previous = stall.executor
        stall.executor = executor
        open = stall
        guard decision.second, !answering else { return false }
        guard let previous, let executor, previous.thread == executor.thread, previous.runnable, executor.runnable
        else { return true }
        return executor.ran - previous.ran >= 1_000_000
    }

    /// The stall of `decision` was sampled: `reported` is the stack found for
    /// `.started`, taken at `seen` (when known), `confirmed` whether it shows
    /// the target's own work (or needs no confirmation), `suppressed` whether a
    /// debugger is attached. `endedAt` is when the target answered, if it did
    /// while the stall was sampled: the profile ends there.
    ///
    /// A stack taken after the target answered is not the stall's (the thread
    /// had moved on to other work): the events show none, and say why.
    mutating func sampled(
        _ decision: Decision, reported: StallBacktrace, samples: [Int32: StallBacktrace], seen: Int64? = nil,
        samplingTime: Int64, confirmed: Bool, suppressed: Bool
    ) -> (report: Report, settled: Bool, endedAt: Int64?) {
        let endedAt = open.flatMap { $0.id == decision.id ? $0.endedWhileSampling?.at : nil }
        let afterEnd = if let endedAt, let seen { seen > endedAt } else { false }
        let report = record(
            decision, reported: afterEnd ? Self.sampledAfterEnd : reported, samples: afterEnd ? [:] : samples,
            samplingTime: samplingTime, confirmed: confirmed, suppressed: suppressed)
        return (report, open == nil, endedAt)
    }

    /// The stack a stall shows when its thread was sampled only after the
    /// target had answered.
    static let sampledAfterEnd = StallBacktrace.unavailable(
        "the target answered before its thread was sampled (the detector's look came late): the stack taken then is not the stall's"
    )

    private mutating func record(
        _ decision: Decision, reported: StallBacktrace, samples: [Int32: StallBacktrace], samplingTime: Int64,
        confirmed: Bool, suppressed: Bool
    ) -> Report {
        guard lifecycle == .running, var stall = open, stall.id == decision.id else { return .nothing }
        stall.samples = samples
        stall.reported = reported
        stall.sampling = samplingTime
        stall.suppressed = suppressed
        guard confirmed else {
            // Look again in a heartbeat. Ended meanwhile: a missed stall.
            stall.phase = .awaitingConfirmation
            open = stall.endedWhileSampling == nil ? stall : nil
            guard let ended = stall.endedWhileSampling, !suppressed else { return .nothing }
            return .missed(
                .missed(
                    id: stall.id, duration: ended.duration, since: lastContinueSeen, processRan: ended.processRan,
                    waitedForCore: ended.waited))
        }
        stall.phase = .reported
        guard let ended = stall.endedWhileSampling else {
            open = stall
            return suppressed ? .nothing : .events(started: reported, ended: nil)
        }
        open = nil
        guard !suppressed else { return .nothing }
        let backtrace = Self.endedBacktrace(answeredBy: ended.thread, samples: samples, reported: reported)
        return .events(started: reported, ended: (ended.duration, backtrace))
    }
}
