import Dispatch
import SafeTimers
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Samples the blocked thread while a stall lasts, for ``StallEvent/profile``, and
/// keeps the fatal report (if any) up to date.
///
/// A *session* begins when the detector first sees an answer late (before the
/// threshold), so that the profile covers the stall from its start; it ends at
/// the answer. Samples are raw stacks taken on the profiler's own thread (a
/// ``DetectorWorker``) with its own ``SamplingContext`` (`capture`), each
/// scheduled on the engine as a `DelayedWork` after the previous one, at the
/// pace ``SamplingPace`` allows. Naming happens on the detector's thread
/// (`naming`), never on the sampling thread: naming the `.started` report or a
/// profile never holds up a sample. The first sample of a session finds the thread that runs the target's job as the `.started` sample does; the
/// others sample that thread alone, and a sample that finds it idle (the job moved
/// to another thread) drops it and finds the thread again.
///
/// Everything shared is behind `state`'s lock; `session.generation` tells a
/// scheduled sample of an ended session from a current one. Sampling and file
/// writes happen outside the lock.
final class StallProfiler: Sendable {
    /// What a session knows once `.started` was emitted: enough to refresh the
    /// fatal report.
    struct OpenStall: Sendable {
        var event: StallEvent
        var start: Int64
        var lastWrite: Int64
    }

    private struct Session: Sendable {
        var generation: UInt64
        var thread: Int32?
        var recorder = RawProfile()
        var activities: [String] = []
        var stall: OpenStall?
        /// Samples in a row that found no thread (none known yet).
        var searchesWithoutThread = 0
        /// When the target first answered (or its run loop moved on) while the
        /// session was open: the stall was over then, and samples taken later
        /// (the detector's threads may take a while to conclude it on a loaded
        /// machine) show the target after it, not the stall.
        var answeredAt: Int64?
        /// Samples whose stacks were handed to be named ahead of `.started`.
        var prefetched = 0
        /// The task the last sample's thread ran, and its parents.
        var task: TaskChain?
    }

    /// How many of a session's first samples are named ahead of its `.started`
    /// report: its functions, so that the report finds them named.
    static let prefetchedSamples = 2

    /// What a session gathered, for its `.ended` event: its samples are named
    /// (``profile(of:)``) on the detector's thread, never on the target's thread
    /// whose answer ended the stall.
    struct Gathered: Sendable {
        var recorder: RawProfile
        var activities: [String]
        var interval: Int64
        /// The task the last sample's thread ran, and its parents.
        var task: TaskChain?
    }

    private struct State: Sendable {
        var generation: UInt64 = 0
        var session: Session?
        var pace = SamplingPace()
        var pending: DelayedWork?
        var stopped = false
        /// CPU time for work done once (naming new code, the first sample) that
        /// is not charged to the pace.
        var namingAllowance = StallProfiler.namingAllowance
    }

    private let state = Locked(State())

    /// The early look, due when an answer is late enough to start sampling:
    /// armed by a beat when it is due before the next one (heartbeat targets),
    /// pushed back by every activity (the run loop).
    private struct EarlyLook: Sendable {
        var work: DelayedWork?
        /// The last answer the early look counts from: it samples only if no
        /// answer came after this one.
        var countingFrom: Int64 = 0
        var stopped = false
    }

    /// The early look's own lock, held while it is armed or moved (the engine's
    /// locks, and for a new look an allocation): only the beat, the run loop's
    /// activities, ``stop()`` and the look itself take it, never the target's
    /// answer (``targetAnswered(at:)``, ``end(until:)``) or a sample, which
    /// take `state`.
    private let earlyLook = Locked(EarlyLook())
    /// Whether a session is open: read on every answer without the lock.
    private let active = Atomic<Bool>(false)
    /// When the target last answered (or its run loop moved on): a session that
    /// `.started` opens after an answer it did not see ends its profile there.
    private let lastAnswer = Atomic<Int64>(0)
    /// The detector's thread: where samples are named.
    private let worker: DetectorWorker
    /// Where samples are taken, and only there.
    private let samplingThread: DetectorWorker
    private let scheduler: any TimerScheduler
    /// The detector's context: names samples (on `queue`).
    private let naming: SamplingContext
    /// The profiler's own context: takes samples (on `samplingThread`).
    private let capture = SamplingContext()
    private let target: StallDetector.Target
    /// The thread that last answered a probe, and the serial queue it ran on.
    private let lastAnswering: @Sendable () -> (thread: Int32?, queue: UInt?)
    /// Whether the target owes an answer and no stall is open (and sampling is
    /// allowed: no debugger, or reports while debugged).
    private let owesAnswer: @Sendable () -> Bool
    /// How long after an answer (or a busy run-loop activity) sampling starts if
    /// the next answer has not come.
    private let lateAfter: Int64
    let fatal: FatalReportWriter?
    /// What scheduling and running a sample costs beyond the sampling thread's
    /// own CPU (the engine's wake-up, the task that runs it, the sampling
    /// thread's wake-up), charged to the pace.
    static let overheadPerSample: Int64 = 25_000
    /// The CPU time naming code for the first time may take without slowing the
    /// pace, once per detector: 200 ms. Each address is named once and cached, so
    /// this is spent in the first stalls only (7–60 ms for a first stall on this
    /// machine, more while other processes load it); the `.started` sample would
    /// pay the same for its own stack.
    static let namingAllowance: Int64 = 200_000_000
    /// The one frame a sample of a running thread that gave no stack counts as.
    static let unsampledRunning = StallBacktrace(
        frames: [
            StackFrame(
                address: 0, function: "<running, stack unavailable (signal blocked or unanswered)>", file: nil,
                line: nil, image: nil, isUncertain: false)
        ], threadID: nil, unavailableReason: nil)

    /// A running thread that gave no stack, in a raw profile (named
    /// ``unsampledRunning``).
    static let unsampledRaw = [RawFrame(address: 0, isUncertain: false)]

    /// How often the fatal report is rewritten while a stall lasts.
    static let fatalRefresh: Int64 = 250_000_000

    init(
        worker: DetectorWorker, scheduler: any TimerScheduler, sampling: SamplingContext, target: StallDetector.Target,
        fatalReportPath: String?, lateAfter: Int64,
        lastAnswering: @escaping @Sendable () -> (thread: Int32?, queue: UInt?),
        owesAnswer: @escaping @Sendable () -> Bool
    ) {
        self.worker = worker
        self.samplingThread = DetectorWorker(name: "StallSampler")
        self.scheduler = scheduler
        self.naming = sampling
        self.target = target
        self.lastAnswering = lastAnswering
        self.owesAnswer = owesAnswer
        self.lateAfter = max(1_000_000, lateAfter)
        self.fatal = fatalReportPath.map(FatalReportWriter.init(path:))
    }

    // MARK: Noticing a late answer

    /// A beat of the shared heartbeat at `now`, the next one due at `next`: if
    /// sampling would start before the next beat (`lateAfter` after the last
    /// answer, or after `notBefore` when later: the probes are spaced wider
    /// than a beat, and the one owed is not posted yet), the early look is armed
    /// for that moment, once per answer. While the target answers, this is one
    /// atomic load.
    func beat(now: Int64, next: Int64, notBefore: Int64? = nil) {
        let answered = max(lastAnswer.load(ordering: .sequentiallyConsistent), notBefore ?? .min)
        guard answered + lateAfter <= next else { return }
        earlyLook.withLock { look in
            guard !look.stopped, look.work == nil || look.countingFrom != answered else { return }
            armEarlyLook(after: max(0, answered + lateAfter - now), countingFrom: answered, &look)
        }
    }

    /// The run loop is busy: sampling starts `lateAfter` from now unless it
    /// moves on again first. One `DelayedWork` moved back at each activity: a
    /// moved entry that is not the engine's earliest costs no wake-up.
    func answered() {
        let answered = lastAnswer.load(ordering: .sequentiallyConsistent)
        earlyLook.withLock { look in
            guard !look.stopped else { return }
            armEarlyLook(after: lateAfter, countingFrom: answered, &look)
        }
    }

    private func armEarlyLook(after delay: Int64, countingFrom answered: Int64, _ look: inout EarlyLook) {
        look.countingFrom = answered
        if let work = look.work, work.reschedule(after: .nanoseconds(delay)) { return }
        look.work = DelayedWork.schedule(after: .nanoseconds(delay), executor: worker, scheduler: scheduler) {
            [weak self] in
            self?.lateAnswer()
        }
    }

    /// The run loop went to sleep: nothing is owed, no early look.
    func idle() {
        earlyLook.withLock { look in
            _ = look.work?.reschedule(after: .seconds(Int64.max))
        }
    }

    /// On the detector's thread, `lateAfter` after the last answer: sampling starts,
    /// so that the profile covers the stall from its start (the first stall too:
    /// a sample names nothing in full, so code never seen before costs it no more
    /// than code seen a thousand times).
    private func lateAnswer() {
        let countedFrom = earlyLook.withLock { $0.countingFrom }
        guard lastAnswer.load(ordering: .sequentiallyConsistent) <= countedFrom, owesAnswer() else { return }
        begin(now: Monotonic.now())
    }

    // MARK: Sessions

    /// An answer is late: start sampling (on the detector's thread), unless a session
    /// is open.
    func begin(now: Int64) {
        let due = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped, state.session == nil else { return nil }
            state.generation &+= 1
            state.session = Session(generation: state.generation)
            state.pace.beginStall()
            active.store(true, ordering: .sequentiallyConsistent)
            return (state.generation, state.pace.next(now: now))
        }
        if let (generation, at) = due { schedule(generation: generation, at: at, now: now) }
    }

    /// `.started` is about to be emitted: samples from before the stall's `start`
    /// go (opening a session if none is), the thread it sampled (at `seen`, when
    /// known) is the one the profile follows, and the activities of the sampled
    /// thread are kept for the stall's events. A stack taken after the target
    /// answered is not the stall's, and chooses nothing.
    func stallStarted(backtrace: StallBacktrace, activities: [String], start: Int64, seen: Int64?, at time: Int64) {
        let answered = lastAnswer.load(ordering: .sequentiallyConsistent)
        let usable = backtrace.unavailableReason == nil && !(answered > start && (seen ?? .min) > answered)
        let schedule = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped else { return nil }
            var opened: (UInt64, Int64)?
            if state.session == nil {
                state.generation &+= 1
                state.session = Session(generation: state.generation)
                state.pace.beginStall()
                active.store(true, ordering: .sequentiallyConsistent)
                opened = (state.generation, state.pace.next(now: time))
                // The target answered after the stall's start, before this session
                // opened: the profile ends at that answer, as it would in a session
                // open when the answer came.
                if answered > start { state.session?.answeredAt = answered }
            }
            state.session?.recorder.dropSamples(before: start)
            if usable, let id = backtrace.threadID.map({ Int32(truncatingIfNeeded: $0) }) {
                // The detection's choice of thread stands: samples of another
                // thread, found before the threshold, go.
                if let earlier = state.session?.thread, earlier != id {
                    state.session?.recorder.dropSamples(before: .max)
                }
                state.session?.thread = id
            }
            // Without a thread of its own, the report keeps what the samples'
            // thread was doing.
            if usable { state.session?.activities = activities }
            return opened
        }
        if let (generation, at) = schedule { self.schedule(generation: generation, at: at, now: time) }
    }

    /// `.started` was emitted: the fatal report is written, and refreshed from now on.
    func stallReported(_ event: StallEvent, start: Int64, at time: Int64) {
        state.withLock { state in
            state.session?.stall = OpenStall(event: event, start: start, lastWrite: time)
        }
        fatal?.write(event)
    }

    /// The profile and activities so far (for an event), its samples named now:
    /// on the detector's thread only. Empty when no session is open.
    func snapshot(awaitsInFull: Bool = true) -> (profile: StallProfile, activities: [String]) {
        guard let gathered = gathered() else { return (.empty, []) }
        return (profile(of: gathered, awaitsInFull: awaitsInFull), gathered.activities)
    }

    /// What the open session gathered so far, if one is open.
    private func gathered() -> Gathered? {
        let (now, continued) = (Monotonic.now(), StopWitness.recordedContinue)
        return state.withLock { state in
            state.session.map { Self.gathered($0, pace: state.pace, now: now, continued: continued) }
        }
    }

    /// A session's samples up to the target's answer, or up to now while the
    /// stall lasts (the last look's stack counts until then; none from after
    /// the answer), its activities and interval.
    private static func gathered(_ session: Session, pace: SamplingPace, now: Int64, continued: Int64?) -> Gathered {
        let end = min(now, session.answeredAt ?? now)
        var recorder = session.recorder.closed(at: end, continued: continued, baseInterval: pace.minimumInterval)
        recorder.dropSamples(after: end)
        return Gathered(
            recorder: recorder, activities: session.activities, interval: pace.interval, task: session.task)
    }

    /// The profile of gathered samples, each distinct stack named in full (on
    /// the detector's thread: naming code for the first time reads debug
    /// information).
    func profile(of gathered: Gathered, awaitsInFull: Bool = true) -> StallProfile {
        gathered.recorder.profile(interval: gathered.interval) { [naming] stacks in
            let named = naming.names(stacks.map { $0 == Self.unsampledRaw ? [] : $0 }, awaitsInFull: awaitsInFull)
            return zip(stacks, named).map { $0 == Self.unsampledRaw ? Self.unsampledRunning.frames : $1 }
        }
    }

    /// The target answered (or its run loop moved on) at `time`: sampling stops,
    /// and the open session's samples from after `time` are left out of its
    /// profile. Safe on any thread; never waits.
    func targetAnswered(at time: Int64) {
        // The latest answer stays (answers of a custom target or the pool come
        // from several threads, in any order). Sequentially consistent, as the
        // store and load of `active` in `stallStarted`: one side sees the other.
        var last = lastAnswer.load(ordering: .sequentiallyConsistent)
        while time > last {
            let (exchanged, original) = lastAnswer.compareExchange(
                expected: last, desired: time, ordering: .sequentiallyConsistent)
            if exchanged { break }
            last = original
        }
        guard active.load(ordering: .sequentiallyConsistent) else { return }
        state.withLock { state in
            if state.session != nil, state.session?.answeredAt == nil { state.session?.answeredAt = time }
        }
    }

    /// How many samples the open session holds, those from after the target
    /// answered too (for tests: sampling stops at the answer).
    var sessionSampleCount: Int? { state.withLock { $0.session?.recorder.count } }

    /// The target answered (at `answer`, when the caller knows it): the session
    /// ends, and what it gathered up to the answer is returned (for the `.ended`
    /// event). Safe on any thread (the target's); never waits. A sample
    /// scheduled meanwhile finds its generation stale.
    @discardableResult
    func end(until answer: Int64? = nil) -> Gathered? {
        guard active.load(ordering: .sequentiallyConsistent) else { return nil }
        let (now, continued) = (Monotonic.now(), StopWitness.recordedContinue)
        let gathered = state.withLock { state -> Gathered? in
            defer {
                state.session = nil
                active.store(false, ordering: .sequentiallyConsistent)
            }
            return state.session.map {
                Self.gathered($0, pace: state.pace, now: min(now, answer ?? now), continued: continued)
            }
        }
        releaseFilesLater()
        return gathered
    }

    /// The `/proc` files kept open for a stall's samples are closed where each
    /// context samples once the stall is over: between stalls the detector holds
    /// no descriptor the program might need.
    private func releaseFilesLater() {
        samplingThread.async { [capture] in DetectorThreads.work { capture.releaseFiles() } }
        worker.async { [naming] in
            DetectorThreads.work {
                naming.releaseFiles()
                StopWitness.releaseFiles()
            }
        }
    }

    /// The detector stopped: no more samples; the fatal report goes (the stall did
    /// not end in a kill).
    func stop() {
        let pending = state.withLock { state -> DelayedWork? in
            state.stopped = true
            state.session = nil
            active.store(false, ordering: .releasing)
            return state.pending.take()
        }
        let look = earlyLook.withLock { look -> DelayedWork? in
            look.stopped = true
            return look.work.take()
        }
        for work in [pending, look] { work?.cancel() }
        releaseFilesLater()
        samplingThread.finish()
        // The file is gone when stop() returns, without waiting for a write in
        // progress (it is dropped), and no sample still under way writes it again.
        fatal?.stopWriting()
    }

    // MARK: Sampling (on the sampling thread)

    private func schedule(generation: UInt64, at time: Int64, now: Int64) {
        let delay = Duration.nanoseconds(max(0, time - now))
        let work = DelayedWork.schedule(after: delay, executor: samplingThread, scheduler: scheduler) { [weak self] in
            DetectorThreads.work { self?.sample(generation: generation) }
        }
        let stopped = state.withLock { state -> Bool in
            if !state.stopped { state.pending = work }
            return state.stopped
        }
        // stop() ran meanwhile and could not see this work.
        if stopped { work.cancel() }
    }

    private func sample(generation: UInt64) {
        let due = state.withLock { state -> (thread: Int32?, reported: Bool, misses: Int)? in
            guard !state.stopped, let session = state.session, session.generation == generation,
                session.answeredAt == nil
            else { return nil }
            return (session.thread, session.stall != nil, session.searchesWithoutThread)
        }
        guard let (known, reported, misses) = due else { return }
        let start = Monotonic.now()
        let cpuBefore = Self.threadCPU()
        let namingBefore = capture.oneTimeCost
        // Every other search after the likely threads missed tries every thread.
        let (frames, found, timing, task) = take(known: known, everyThread: reported || misses % 2 == 1)
        let cost = Self.threadCPU() - cpuBefore
        let naming = max(0, min(cost, capture.oneTimeCost - namingBefore))
        let taken = Monotonic.now()
        // When the stack was the thread's (a late answer to the signal still
        // shows the thread as it was when the signal came; one that never
        // answered was running from the look's start), and when the signal was
        // sent: the look's time before it (finding the thread, sampling others)
        // is the sampler's own.
        let seen = max(start, min(taken, timing?.seen ?? (frames == Self.unsampledRaw ? start : taken)))
        let sent = max(start, seen - (timing?.answerDelay ?? 0))
        let continued = StopWitness.recordedContinue
        var refresh: Gathered?
        // The labels of a thread the profile follows for the first time: a stall
        // no look saw in time (reported from its samples) still says what its
        // thread was doing.
        let labels = found.flatMap {
            $0 == known ? nil : ActivityRecord.activities(ofThread: UInt64(UInt32(bitPattern: $0)))
        }
        let look = Look(
            frames: frames, known: known, found: found, misses: misses, labels: labels, start: sent, seen: seen,
            task: task)
        var prefetch = false
        let next = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped, state.session?.generation == generation else { return nil }
            prefetch = Self.keep(look, continued: continued, baseInterval: state.pace.minimumInterval, in: &state)
            let nextTime = Self.charge(cost, naming: naming, start: start, typical: known != nil, to: &state)
            refresh = dueRefresh(&state, now: taken, continued: continued)
            return (generation, nextTime)
        }
        if prefetch, let frames { capture.prefetchNames(frames) }
        if let refresh { worker.async { DetectorThreads.work { self.writeRefresh(refresh) } } }
        if Self.traced {
            SamplingTrace.sample(
                cost: cost, naming: naming, kept: frames != nil, next: next.map { $0.1 - taken }, taken: taken)
            if let frames, frames != Self.unsampledRaw { SamplingTrace.frames(frames) }
        }
        if let (generation, at) = next { schedule(generation: generation, at: at, now: Monotonic.now()) }
    }

    /// What one look found: the stack (nil: none; ``unsampledRaw``: running, not
    /// sampled), the thread it followed and the one it found, and when the stack
    /// was the thread's.
    private struct Look {
        let frames: [RawFrame]?
        let known: Int32?
        let found: Int32?
        let misses: Int
        /// The activities of a thread the profile follows for the first time.
        let labels: [String]?
        let start: Int64
        let seen: Int64
        /// The task the thread ran, and its parents (``RawStack/task``).
        let task: TaskChain?
    }

    /// Adds a look to the open session (under the lock) and returns whether its
    /// stack's names are to be prefetched. A look is left out when `.started`
    /// chose another thread while it was under way (and dropped the samples of
    /// the one it followed): its stack is not the stall's.
    private static func keep(_ look: Look, continued: Int64?, baseInterval: Int64, in state: inout State) -> Bool {
        guard var session = state.session else { return false }
        if let chosen = session.thread, chosen != look.known, chosen != look.found { return false }
        // Taken out while it changes: the recorder's storage is not copied.
        state.session = nil
        var prefetch = false
        if let labels = look.labels, session.stall == nil { session.activities = labels }
        if look.frames != nil, look.frames != unsampledRaw, session.stall == nil,
            session.prefetched < prefetchedSamples
        {
            session.prefetched += 1
            prefetch = true
        }
        session.thread = look.found
        // The task goes with the stack it was read with (none with none).
        if look.frames != nil { session.task = look.task }
        session.searchesWithoutThread = look.found == nil ? look.misses + 1 : 0
        session.recorder.add(
            look: look.frames, start: look.start, seen: look.seen, continued: continued, baseInterval: baseInterval)
        state.session = session
        return prefetch
    }

    /// Charges a sample's CPU to the pace (thinning the profile out when the
    /// pace slows down) and returns when the next may start. Work done once
    /// (naming functions never seen before by their symbols, tens of
    /// microseconds each, then cached for good; the context's first sample) is
    /// paid from a one-time allowance first, and charged only beyond it.
    private static func charge(
        _ cost: Int64, naming: Int64, start: Int64, typical: Bool, to state: inout State
    ) -> Int64 {
        let forgiven = min(naming, state.namingAllowance)
        state.namingAllowance -= forgiven
        let stride = state.session?.recorder.stride ?? 1
        let (next, slower) = state.pace.sampled(
            start: start, cost: cost - forgiven + overheadPerSample, stride: stride, typical: typical)
        if slower { state.session?.recorder.thinOut() }
        return next
    }

    /// One sample of the blocked thread (`known`, or found as `.started` finds
    /// it): its raw stack, and the thread to sample next time (nil: find it
    /// again, the job moved).
    ///
    /// Without `everyThread`, a thread not known yet is looked for among the
    /// likely threads only (the main thread, the one that answered last): trying
    /// every thread holds up the detector's thread. With it (after `.started`, and
    /// every other search after the likely threads ran nothing of the target) all
    /// threads are tried: a `queue.sync` caller runs the queue's job on its own
    /// thread, and a stall no look saw in time is reported only if a sample saw
    /// its job.
    private func take(
        known: Int32?, everyThread: Bool
    ) -> Taken {
        let (answering, queue) = lastAnswering()
        if let queue, target.ownsProbeQueue, let drained = takeFromDrainer(of: queue) { return drained }
        guard let known else {
            let search = capture.find(
                target: target, lastAnswering: answering, queue: queue, candidatesOnly: !everyThread)
            if everyThread { capture.releaseFiles(except: search.found?.thread) }
            guard let raw = search.found, keeps(raw) else { return (nil, nil, nil, nil) }
            return (raw.profileFrames, raw.thread, raw.timing, raw.task)
        }
        switch capture.sample(known, queue: queue) {
        case .stack(let raw) where keeps(raw):
            return (raw.profileFrames, known, raw.timing, raw.task)
        case .failed(let backtrace) where backtrace.whileRunning:
            // The thread ran code it could not be asked about (signals blocked,
            // or no answer): that time counts, as unknown code, rather than
            // vanishing from the shares.
            return (Self.unsampledRaw, known, nil, nil)
        default:
            return (nil, nil, nil, nil)
        }
    }

    /// What one look took: the stack (nil: none; ``unsampledRaw``: running,
    /// not sampled), the thread, when the stack was the thread's, and the task
    /// it ran (``RawStack/task``).
    private typealias Taken = (frames: [RawFrame]?, thread: Int32?, timing: RawStack.Timing?, task: TaskChain?)

    /// Looks for the target's blocked thread for the detector's `.started`
    /// report, with the profile's own sampler, on its queue (waiting for a sample
    /// under way): one thread never gets two detectors' worth of signals at once
    /// from one detector, and the report's unwind finds the calls the profile's
    /// samples have decoded already. Names nothing; called on the detector's thread.
    func findBlockedThread(lastAnswering: Int32?, queue: UInt?) -> SamplingContext.Search {
        samplingThread.sync { [capture, target] in
            capture.find(target: target, lastAnswering: lastAnswering, queue: queue, candidatesOnly: false)
        }
    }

    /// A sample of the thread that drains the watched serial queue, as
    /// libdispatch records it (``QueueDrainer``): the thread is neither searched
    /// for nor judged by its frames, so a sample costs one capture and no naming.
    /// Nil when the drain lock cannot be read (the thread is then found as before).
    private func takeFromDrainer(of queue: UInt) -> Taken? {
        switch QueueDrainer.answer(for: queue) {
        case .unknown:
            return nil
        case .noThread:
            return (nil, nil, nil, nil)
        case .thread(let drainer):
            switch capture.sample(drainer, queue: queue) {
            case .stack(let raw): return (raw.profileFrames, drainer, raw.timing, raw.task)
            case .failed(let backtrace) where backtrace.whileRunning: return (Self.unsampledRaw, drainer, nil, nil)
            default: return (nil, nil, nil, nil)
            }
        }
    }

    /// The detector's look during a stall (every heartbeat): the fatal report is
    /// rewritten if its last write is `fatalRefresh` old, whether or not samples
    /// came meanwhile.
    func refreshFatalReport(now: Int64) {
        guard fatal != nil else { return }
        let continued = StopWitness.recordedContinue
        if let due = state.withLock({ dueRefresh(&$0, now: now, continued: continued) }) { writeRefresh(due) }
    }

    /// What to write now, if a stall was reported and its file is `fatalRefresh`
    /// old.
    private func dueRefresh(_ state: inout State, now: Int64, continued: Int64?) -> Gathered? {
        guard fatal != nil, let session = state.session, let stall = session.stall,
            now - stall.lastWrite >= Self.fatalRefresh
        else { return nil }
        state.session?.stall?.lastWrite = now
        return Self.gathered(session, pace: state.pace, now: now, continued: continued)
    }

    /// Writes the fatal report of the open stall with `gathered`'s samples
    /// (named here: on the detector's thread only).
    private func writeRefresh(_ gathered: Gathered) {
        let profile = profile(of: gathered)
        // Asked for under the lock that ends the session: a stall that ended
        // while its profile was named (its `.ended` removes the report right
        // after) gets no report written after that removal.
        state.withLock { state in
            guard let stall = state.session?.stall else { return }
            fatal?.write(stall.event.inProgress(duration: Monotonic.now() - stall.start, profile: profile))
        }
    }

    /// Whether a sample of the blocked thread counts: a queue's or the pool's
    /// thread must be running a job (of the watched queue, where it is known); a
    /// custom executor's thread (an event loop, which runs no dispatch job) must
    /// only not be waiting for work.
    private func keeps(_ raw: RawStack) -> Bool {
        switch capture.runsQueue(raw) {
        case false?: return false
        case true? where raw.currentQueue != nil: return true
        default: break
        }
        switch target {
        case .custom where raw.queue == nil:
            // An executor with a thread of its own (an event loop): waiting for
            // work when the kernel says it sleeps in `epoll_wait`; any other
            // state is its job's time. No names are read: a sample never waits
            // for the naming of code seen for the first time.
            return !capture.isInEventWait(raw.thread)
        case .custom: return !capture.isIdle(raw)
        case .mainRunLoop: return true
        case .cooperativePool: return capture.summary(raw).holdsPoolThread
        default: return capture.summary(raw).runsJob
        }
    }

    /// Whether each sample is traced (``SamplingTrace``).
    private static let traced = SamplingTrace.isEnabled

    /// The calling thread's CPU time in nanoseconds.
    static func threadCPU() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
        return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
    }
}
