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
/// profile never holds up a sample. The first sample of a session finds the
/// thread that runs the target's job as the `.started` sample does; the others
/// sample that thread alone, and a sample that finds it idle (the job moved to
/// another thread) drops it and finds the thread again.
///
/// What to do is decided by ``ProfilerSessions`` (pure: when a session opens,
/// which samples it keeps, when the next is due), kept behind `state`'s lock;
/// a session's generation tells a scheduled sample of an ended session from a
/// current one. Sampling, timers and file writes happen outside the lock.
final class StallProfiler: Sendable {
    typealias Gathered = ProfilerSessions.Gathered

    private struct State: Sendable {
        var sessions: ProfilerSessions
        /// The next sample, armed after the lock that planned it.
        var pending: DelayedWork?
    }

    private let state: Locked<State>

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
        self.state = Locked(State(sessions: ProfilerSessions(keepsFatalReport: fatalReportPath != nil)))
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
        let due = state.withLock { state -> (generation: UInt64, at: Int64)? in
            let due = state.sessions.open(now: now)
            if due != nil { active.store(true, ordering: .sequentiallyConsistent) }
            return due
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
        let thread = backtrace.threadID.map { Int32(truncatingIfNeeded: $0) }
        let schedule = state.withLock { state -> (generation: UInt64, at: Int64)? in
            let wasOpen = state.sessions.isOpen
            let opened = state.sessions.stallStarted(
                thread: thread, usable: usable, activities: activities, start: start, answered: answered, now: time)
            if !wasOpen, state.sessions.isOpen { active.store(true, ordering: .sequentiallyConsistent) }
            return opened
        }
        if let (generation, at) = schedule { self.schedule(generation: generation, at: at, now: time) }
    }

    /// `.started` was emitted: the fatal report is written, and refreshed from now on.
    func stallReported(_ event: StallEvent, start: Int64, at time: Int64) {
        state.withLock { $0.sessions.stallReported(event, start: start, at: time) }
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
        return state.withLock { $0.sessions.gathered(now: now, continued: continued) }
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
        state.withLock { $0.sessions.answered(at: time) }
    }

    /// How many samples the open session holds, those from after the target
    /// answered too (for tests: sampling stops at the answer).
    var sessionSampleCount: Int? { state.withLock { $0.sessions.sampleCount } }

    /// The target answered (at `answer`, when the caller knows it): the session
    /// ends, and what it gathered up to the answer is returned (for the `.ended`
    /// event). Safe on any thread (the target's); never waits. A sample
    /// scheduled meanwhile finds its generation stale.
    @discardableResult
    func end(until answer: Int64? = nil) -> Gathered? {
        guard active.load(ordering: .sequentiallyConsistent) else { return nil }
        let (now, continued) = (Monotonic.now(), StopWitness.recordedContinue)
        let gathered = state.withLock { state -> Gathered? in
            defer { active.store(false, ordering: .sequentiallyConsistent) }
            return state.sessions.end(now: min(now, answer ?? now), continued: continued)
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
            state.sessions.stop()
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
            if !state.sessions.stopped { state.pending = work }
            return state.sessions.stopped
        }
        // stop() ran meanwhile and could not see this work.
        if stopped { work.cancel() }
    }

    private func sample(generation: UInt64) {
        guard let due = state.withLock({ $0.sessions.sampleDue(generation: generation) }) else { return }
        let (known, reported, misses) = (due.thread, due.reported, due.misses)
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
        let look = ProfilerSessions.Look(
            frames: frames, known: known, found: found, misses: misses, labels: labels, start: sent, seen: seen,
            task: task)
        var prefetch = false
        let next = state.withLock { state -> (UInt64, Int64)? in
            guard
                let sampled = state.sessions.sampled(
                    look, generation: generation, cost: cost, naming: naming, start: start, continued: continued)
            else { return nil }
            prefetch = sampled.prefetch
            refresh = state.sessions.dueRefresh(now: taken, continued: continued)
            return (generation, sampled.next)
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
    /// rewritten if its last write is ``ProfilerSessions/fatalRefresh`` old, whether or not samples
    /// came meanwhile.
    func refreshFatalReport(now: Int64) {
        guard fatal != nil else { return }
        let continued = StopWitness.recordedContinue
        if let due = state.withLock({ $0.sessions.dueRefresh(now: now, continued: continued) }) { writeRefresh(due) }
    }

    /// Writes the fatal report of the open stall with `gathered`'s samples
    /// (named here: on the detector's thread only).
    private func writeRefresh(_ gathered: Gathered) {
        let profile = profile(of: gathered)
        // Asked for under the lock that ends the session: a stall that ended
        // while its profile was named (its `.ended` removes the report right
        // after) gets no report written after that removal.
        state.withLock { state in
            guard let stall = state.sessions.openStall else { return }
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
