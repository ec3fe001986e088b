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
/// the answer. Samples are taken on the detector's queue (the only place the
/// sampler may run), each scheduled on the engine as a `DelayedWork` after the
/// previous one, at the pace ``SamplingPace`` allows. The first sample of a session
/// finds the thread that runs the target's job as the `.started` sample does; the
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
        var recorder = ProfileRecorder()
        var activities: [String] = []
        var stall: OpenStall?
    }

    private struct State: Sendable {
        var generation: UInt64 = 0
        var session: Session?
        var pace = SamplingPace()
        var pending: DelayedWork?
        /// Due when an answer is late enough to start sampling; every answer
        /// pushes it back.
        var earlyLook: DelayedWork?
        /// A stall was reported: the stacks it ran in are named and cached, so
        /// samples before the threshold are cheap enough to take.
        var warm = false
        var stopped = false
        /// CPU time for naming new code that is not charged to the pace.
        var namingAllowance = StallProfiler.namingAllowance
    }

    private let state = Locked(State())
    /// Whether the frames at an address run a queue's job (sampling on the
    /// detector queue only; behind a lock of its own).
    private let jobAddresses = Locked<[UInt: JobFrame]>([:])
    /// Whether a session is open: read on every answer without the lock.
    private let active = Atomic<Bool>(false)
    private let queue: DispatchQueue
    private let scheduler: any TimerScheduler
    private let sampling: SamplingContext
    private let target: StallDetector.Target
    private let lastAnswering: @Sendable () -> Int32?
    /// Whether the target owes an answer and no stall is open (and sampling is
    /// allowed: no debugger, or reports while debugged).
    private let owesAnswer: @Sendable () -> Bool
    /// How long after an answer (or a busy run-loop activity) sampling starts if
    /// the next answer has not come.
    private let lateAfter: Int64
    let fatal: FatalReportWriter?
    /// What scheduling and running a sample costs beyond the sampling thread's
    /// own CPU (the engine's and a dispatch worker's wake-up), charged to the pace.
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

    /// How often the fatal report is rewritten while a stall lasts.
    static let fatalRefresh: Int64 = 250_000_000

    init(
        queue: DispatchQueue, scheduler: any TimerScheduler, sampling: SamplingContext, target: StallDetector.Target,
        fatalReportPath: String?, lateAfter: Int64, lastAnswering: @escaping @Sendable () -> Int32?,
        owesAnswer: @escaping @Sendable () -> Bool
    ) {
        self.queue = queue
        self.scheduler = scheduler
        self.sampling = sampling
        self.target = target
        self.lastAnswering = lastAnswering
        self.owesAnswer = owesAnswer
        self.lateAfter = max(1_000_000, lateAfter)
        self.fatal = fatalReportPath.map(FatalReportWriter.init(path:))
    }

    // MARK: Noticing a late answer

    /// The target answered (or the run loop is busy): sampling starts `lateAfter`
    /// from now unless it answers again first.
    ///
    /// One `DelayedWork` moved back at each answer, not a `Watchdog` kick: a
    /// kicked watchdog's engine entry still fires at its old deadline to re-arm
    /// (a wake-up every `lateAfter`, 16 a second at the default heartbeat), while
    /// a moved entry is never the engine's earliest (the next probe is earlier),
    /// so it costs no wake-up at all while the target answers.
    func answered() {
        state.withLock { state in
            guard !state.stopped else { return }
            if let work = state.earlyLook, work.reschedule(after: .nanoseconds(lateAfter)) { return }
            state.earlyLook = DelayedWork.schedule(after: .nanoseconds(lateAfter), on: queue, scheduler: scheduler) {
                [weak self] in
                self?.lateAnswer()
            }
        }
    }

    /// The run loop went to sleep: nothing is owed, no early look.
    func idle() {
        state.withLock { state in
            _ = state.earlyLook?.reschedule(after: .seconds(Int64.max))
        }
    }

    /// On the detector queue, `lateAfter` after the last answer.
    ///
    /// Not before this detector has reported a stall: until then its symbol cache
    /// is cold, and naming code for the first time (tens of milliseconds, far
    /// more on a loaded machine) on the detector's queue would hold up the look
    /// that detects the stall. The first stall is profiled from `.started` on.
    private func lateAnswer() {
        guard state.withLock({ $0.warm }) else { return }
        if owesAnswer() { begin(now: Monotonic.now()) }
    }

    // MARK: Sessions

    /// An answer is late: start sampling (on the detector queue), unless a session
    /// is open.
    func begin(now: Int64) {
        let due = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped, state.session == nil else { return nil }
            state.generation &+= 1
            state.session = Session(generation: state.generation)
            state.pace.beginStall()
            active.store(true, ordering: .releasing)
            return (state.generation, state.pace.next(now: now))
        }
        if let (generation, at) = due { schedule(generation: generation, at: at, now: now) }
    }

    /// `.started` is about to be emitted: the sample it took joins the profile
    /// (opening a session if none is), samples from before the stall's `start` go,
    /// and the activities of the sampled thread are kept for the stall's events.
    func stallStarted(backtrace: StallBacktrace, activities: [String], start: Int64, at time: Int64) {
        let schedule = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped else { return nil }
            var opened: (UInt64, Int64)?
            if state.session == nil {
                state.generation &+= 1
                state.session = Session(generation: state.generation)
                state.pace.beginStall()
                active.store(true, ordering: .releasing)
                opened = (state.generation, state.pace.next(now: time))
            }
            state.session?.recorder.dropSamples(before: start)
            if backtrace.unavailableReason == nil, let id = backtrace.threadID.map({ Int32(truncatingIfNeeded: $0) }) {
                // The detection's choice of thread stands: samples of another
                // thread, found before the threshold, go.
                if let earlier = state.session?.thread, earlier != id {
                    state.session?.recorder.dropSamples(before: .max)
                }
                state.session?.thread = id
                state.session?.recorder.add(backtrace.frames, at: time)
            }
            state.session?.activities = activities
            return opened
        }
        if let (generation, at) = schedule { self.schedule(generation: generation, at: at, now: time) }
    }

    /// `.started` was emitted: the fatal report is written, and refreshed from now on.
    func stallReported(_ event: StallEvent, start: Int64, at time: Int64) {
        state.withLock { state in
            state.session?.stall = OpenStall(event: event, start: start, lastWrite: time)
            state.warm = true
        }
        fatal?.write(event)
    }

    /// The profile and activities so far (for an event); cheap: the counts are kept
    /// up to date. Empty when no session is open.
    func snapshot() -> (profile: StallProfile, activities: [String]) {
        state.withLock { state in
            guard let session = state.session else { return (.empty, []) }
            return (session.recorder.profile(interval: state.pace.interval), session.activities)
        }
    }

    /// The target answered: the session ends. Safe on any thread (the target's);
    /// never waits. A sample scheduled meanwhile finds its generation stale.
    func end() {
        guard active.load(ordering: .acquiring) else { return }
        state.withLock { state in
            state.session = nil
            active.store(false, ordering: .releasing)
        }
        releaseFilesLater()
    }

    /// The `/proc` files kept open for a stall's samples are closed on the
    /// detector queue (where sampling happens) once the stall is over: between
    /// stalls the detector holds no descriptor the program might need.
    private func releaseFilesLater() {
        queue.async { [sampling] in
            sampling.releaseFiles()
            StopWitness.releaseFiles()
        }
    }

    /// The detector stopped: no more samples; the fatal report goes (the stall did
    /// not end in a kill).
    func stop() {
        let pending = state.withLock { state -> [DelayedWork?] in
            state.stopped = true
            state.session = nil
            active.store(false, ordering: .releasing)
            defer { (state.pending, state.earlyLook) = (nil, nil) }
            return [state.pending, state.earlyLook]
        }
        for work in pending { work?.cancel() }
        releaseFilesLater()
        // The file is gone when stop() returns.
        fatal?.remove()
        fatal?.flush()
    }

    // MARK: Sampling (on the detector queue)

    private func schedule(generation: UInt64, at time: Int64, now: Int64) {
        let delay = Duration.nanoseconds(max(0, time - now))
        let work = DelayedWork.schedule(after: delay, on: queue, scheduler: scheduler) { [weak self] in
            self?.sample(generation: generation)
        }
        let stopped = state.withLock { state -> Bool in
            if !state.stopped { state.pending = work }
            return state.stopped
        }
        // stop() ran meanwhile and could not see this work.
        if stopped { work.cancel() }
    }

    private func sample(generation: UInt64) {
        let look = state.withLock { state -> (thread: Int32?, reported: Bool)? in
            guard !state.stopped, let session = state.session, session.generation == generation else { return nil }
            return (session.thread, session.stall != nil)
        }
        guard let (known, reported) = look else { return }
        let start = Monotonic.now()
        let cpuBefore = Self.threadCPU()
        let namingBefore = sampling.namingCost
        var backtrace: StallBacktrace?
        var found: Int32?
        if let known {
            let sampled = sampling.backtrace(of: known)
            if sampled.unavailableReason == nil, keeps(sampled.frames) {
                backtrace = sampled
                found = known
            } else if sampled.whileRunning {
                // The thread ran code it could not be asked about (signals
                // blocked, or no answer): that time counts, as unknown code,
                // rather than vanishing from the shares.
                backtrace = Self.unsampledRunning
                found = known
            }
        } else {
            // Before `.started`, only the likely threads (the main thread, the
            // one that answered last): trying every thread holds up the
            // detector's queue, and `.started` finds the thread anyway.
            let (chosen, _) = sampling.sampleBlockedThread(
                target: target, lastAnswering: lastAnswering(), candidatesOnly: !reported)
            if chosen.unavailableReason == nil, keeps(chosen.frames),
                let id = chosen.threadID
            {
                backtrace = chosen
                found = Int32(truncatingIfNeeded: id)
            }
        }
        let cost = Self.threadCPU() - cpuBefore
        let naming = max(0, min(cost, sampling.namingCost - namingBefore))
        let taken = Monotonic.now()
        var refresh: StallEvent?
        let next = state.withLock { state -> (UInt64, Int64)? in
            guard !state.stopped, state.session?.generation == generation else { return nil }
            state.session?.thread = found
            if let backtrace { state.session?.recorder.add(backtrace.frames, at: taken) }
            let stride = state.session?.recorder.stride ?? 1
            // Naming code never seen before (2–20 ms for a stack in a process'
            // first stall, then cached for good) is paid from a one-time
            // allowance first, and charged only beyond it.
            let forgiven = min(naming, state.namingAllowance)
            state.namingAllowance -= forgiven
            let charged = cost - forgiven + Self.overheadPerSample
            let (nextTime, slower) = state.pace.sampled(
                start: start, cost: charged, stride: stride, typical: known != nil)
            if slower { state.session?.recorder.thinOut() }
            refresh = dueRefresh(&state, now: taken)
            return (generation, nextTime)
        }
        if let refresh { fatal?.write(refresh) }
        if let (generation, at) = next { schedule(generation: generation, at: at, now: Monotonic.now()) }
    }

    /// The detector's look during a stall (every heartbeat): the fatal report is
    /// rewritten if its last write is `fatalRefresh` old, whether or not samples
    /// came meanwhile.
    func refreshFatalReport(now: Int64) {
        guard fatal != nil else { return }
        if let event = state.withLock({ dueRefresh(&$0, now: now) }) { fatal?.write(event) }
    }

    /// The report to write now, if a stall was reported and its file is
    /// `fatalRefresh` old.
    private func dueRefresh(_ state: inout State, now: Int64) -> StallEvent? {
        guard fatal != nil, let stall = state.session?.stall, now - stall.lastWrite >= Self.fatalRefresh,
            let profile = state.session?.recorder.profile(interval: state.pace.interval)
        else { return nil }
        state.session?.stall?.lastWrite = now
        return stall.event.inProgress(duration: now - stall.start, profile: profile)
    }

    /// Whether a sample of the blocked thread counts: a queue's or the pool's
    /// thread must be running a job; a custom executor's thread (an event loop,
    /// which runs no dispatch job) must only not be waiting for work.
    private func keeps(_ frames: [StackFrame]) -> Bool {
        if case .custom = target { return !StackShape.looksIdle(frames) }
        return !target.usesHeartbeat || runsJob(frames)
    }

    /// ``StackShape/runsJob(_:)``, with what the frames at each address say
    /// remembered: it runs on every sample.
    private func runsJob(_ frames: [StackFrame]) -> Bool {
        jobAddresses.withLock { known in
            if known.count > 100_000 { known.removeAll() }
            var job = false
            var index = 0
            while index < frames.count {
                var end = index + 1
                while end < frames.count && frames[end].address == frames[index].address { end += 1 }
                let address = frames[index].address
                let kind: JobFrame
                if let cached = known[address] {
                    kind = cached
                } else {
                    let group = Array(frames[index..<end])
                    let names = group.compactMap(\.function)
                    if names.contains(where: { name in StackShape.managerMarkers.contains { name.containsText($0) } }) {
                        kind = .manager
                    } else {
                        kind = StackShape.runsJob(group) ? .job : .other
                    }
                    known[address] = kind
                }
                if kind == .manager { return false }
                if kind == .job { job = true }
                index = end
            }
            return job
        }
    }

    /// What the frames at one address say about the thread.
    enum JobFrame: Sendable {
        case job, manager, other
    }

    /// The calling thread's CPU time in nanoseconds.
    static func threadCPU() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
        return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
    }
}
