/// The profiler's session policy, pure (no lock, clock, thread or timer):
/// when a session opens, which thread its samples follow, which samples it
/// keeps, what each sample costs the pace and when the next may start, where
/// the profile ends, and when the fatal report is due to be rewritten.
/// ``StallProfiler`` keeps it under its lock, takes the samples and arms the
/// timers it plans; every time is given.
///
/// A *session* is one stall's sampling: opened when an answer is late (before
/// the threshold) or by `.started`, ended by the target's answer or by
/// ``stop()``. `generation` tells a sample scheduled for an ended session from
/// one of the open session.
struct ProfilerSessions: Sendable {
    /// What a session knows once `.started` was emitted: enough to refresh the
    /// fatal report.
    struct OpenStall: Sendable {
        var event: StallEvent
        var start: Int64
        var lastWrite: Int64
    }

    /// What a session gathered, for its `.ended` event: its samples are named
    /// (``StallProfiler/profile(of:awaitsInFull:)``) on the detector's thread,
    /// never on the target's thread whose answer ended the stall.
    struct Gathered: Sendable {
        var recorder: RawProfile
        var activities: [String]
        var interval: Int64
        /// The task the last sample's thread ran, and its parents.
        var task: TaskChain?
    }

    /// What one look found: the stack (nil: none; ``StallProfiler/unsampledRaw``:
    /// running, not sampled), the thread it followed and the one it found, and
    /// when the stack was the thread's.
    struct Look {
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

    /// What a sample due for `generation` is to do: follow `thread` (nil: find
    /// it), and look at every thread once the stall is reported or every other
    /// search missed.
    struct SampleDue {
        let thread: Int32?
        let reported: Bool
        let misses: Int
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
    /// How often the fatal report is rewritten while a stall lasts.
    static let fatalRefresh: Int64 = 250_000_000

    /// Whether a fatal report is kept (its refreshes are planned).
    let keepsFatalReport: Bool
    private(set) var stopped = false
    private var generation: UInt64 = 0
    private var session: Session?
    private var pace = SamplingPace()
    /// CPU time for work done once (naming new code, the first sample) that
    /// is not charged to the pace.
    private var namingAllowance = Self.namingAllowance

    init(keepsFatalReport: Bool) {
        self.keepsFatalReport = keepsFatalReport
    }

    /// Whether a session is open.
    var isOpen: Bool { session != nil }

    /// How many samples the open session holds.
    var sampleCount: Int? { session?.recorder.count }

    /// The open session's reported stall, once `.started` was emitted.
    var openStall: OpenStall? { session?.stall }

    // MARK: Opening and ending

    /// An answer is late at `now`: a session opens unless one is open. Returns
    /// its generation and when its first sample is due.
    mutating func open(now: Int64) -> (generation: UInt64, at: Int64)? {
        guard !stopped, session == nil else { return nil }
        return openSession(now: now)
    }

    private mutating func openSession(now: Int64) -> (generation: UInt64, at: Int64) {
        generation &+= 1
        session = Session(generation: generation)
        pace.beginStall()
        return (generation, pace.next(now: now))
    }

    /// `.started` is about to be emitted at `now` for a stall from `start`: samples
    /// from before it go (opening a session if none is; its profile ends at
    /// `answered` when the target answered after `start`); `thread` (the
    /// `.started` sample's, when usable) is the one the profile follows, and its
    /// `activities` are kept. Returns the first sample of a session it opened.
    mutating func stallStarted(
        thread: Int32?, usable: Bool, activities: [String], start: Int64, answered: Int64, now: Int64
    ) -> (generation: UInt64, at: Int64)? {
        guard !stopped else { return nil }
        var opened: (generation: UInt64, at: Int64)?
        if session == nil {
            opened = openSession(now: now)
            // The target answered after the stall's start, before this session
            // opened: the profile ends at that answer, as it would in a session
            // open when the answer came.
            if answered > start { session?.answeredAt = answered }
        }
        session?.recorder.dropSamples(before: start)
        if usable, let thread {
            // The detection's choice of thread stands: samples of another
            // thread, found before the threshold, go.
            if let earlier = session?.thread, earlier != thread { session?.recorder.dropSamples(before: .max) }
            session?.thread = thread
        }
        // Without a thread of its own, the report keeps what the samples'
        // thread was doing.
        if usable { session?.activities = activities }
        return opened
    }

    /// `.started` was emitted at `time`: the fatal report is refreshed from now on.
    mutating func stallReported(_ event: StallEvent, start: Int64, at time: Int64) {
        session?.stall = OpenStall(event: event, start: start, lastWrite: time)
    }

    /// The target answered at `time`: the open session's profile ends there.
    mutating func answered(at time: Int64) {
        if session != nil, session?.answeredAt == nil { session?.answeredAt = time }
    }

    /// What the open session gathered up to `now` (the answer, when earlier).
    func gathered(now: Int64, continued: Int64?) -> Gathered? {
        session.map { Self.gathered($0, pace: pace, now: now, continued: continued) }
    }

    /// The session ends at `now`; returns what it gathered.
    mutating func end(now: Int64, continued: Int64?) -> Gathered? {
        defer { session = nil }
        return gathered(now: now, continued: continued)
    }

    /// No more sessions.
    mutating func stop() {
        stopped = true
        session = nil
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

    // MARK: Samples

    /// What the sample scheduled for `generation` is to do; nil when its session
    /// ended (or the target answered).
    func sampleDue(generation: UInt64) -> SampleDue? {
        guard !stopped, let session, session.generation == generation, session.answeredAt == nil else { return nil }
        return SampleDue(thread: session.thread, reported: session.stall != nil, misses: session.searchesWithoutThread)
    }

    /// A sample of `generation` found `look`, at a cost of `cost` nanoseconds
    /// of CPU (`naming` of it naming code for the first time) from `start`:
    /// the look is kept (or left out), the cost charged. Returns whether its
    /// names are to be prefetched and when the next sample is due; nil when its
    /// session ended meanwhile.
    mutating func sampled(
        _ look: Look, generation: UInt64, cost: Int64, naming: Int64, start: Int64, continued: Int64?
    ) -> (prefetch: Bool, next: Int64)? {
        guard !stopped, session?.generation == generation else { return nil }
        let prefetch = keep(look, continued: continued)
        return (prefetch, charge(cost, naming: naming, start: start, typical: look.known != nil))
    }

    /// Adds a look to the open session and returns whether its stack's names
    /// are to be prefetched. A look is left out when `.started` chose another
    /// thread while it was under way (and dropped the samples of the one it
    /// followed): its stack is not the stall's.
    private mutating func keep(_ look: Look, continued: Int64?) -> Bool {
        guard var session else { return false }
        if let chosen = session.thread, chosen != look.known, chosen != look.found { return false }
        // Taken out while it changes: the recorder's storage is not copied.
        self.session = nil
        var prefetch = false
        if let labels = look.labels, session.stall == nil { session.activities = labels }
        if look.frames != nil, look.frames != StallProfiler.unsampledRaw, session.stall == nil,
            session.prefetched < Self.prefetchedSamples
        {
            session.prefetched += 1
            prefetch = true
        }
        session.thread = look.found
        // The task goes with the stack it was read with (none with none).
        if look.frames != nil { session.task = look.task }
        session.searchesWithoutThread = look.found == nil ? look.misses + 1 : 0
        session.recorder.add(
            look: look.frames, start: look.start, seen: look.seen, continued: continued,
            baseInterval: pace.minimumInterval)
        self.session = session
        return prefetch
    }

    /// Charges a sample's CPU to the pace (thinning the profile out when the
    /// pace slows down) and returns when the next may start. Work done once
    /// (naming functions never seen before by their symbols, tens of
    /// microseconds each, then cached for good; the context's first sample) is
    /// paid from a one-time allowance first, and charged only beyond it.
    private mutating func charge(_ cost: Int64, naming: Int64, start: Int64, typical: Bool) -> Int64 {
        let forgiven = min(naming, namingAllowance)
        namingAllowance -= forgiven
        let stride = session?.recorder.stride ?? 1
        let (next, slower) = pace.sampled(
            start: start, cost: cost - forgiven + Self.overheadPerSample, stride: stride, typical: typical)
        if slower { session?.recorder.thinOut() }
        return next
    }

    /// What to write at `now`, if a stall was reported and its file is
    /// ``fatalRefresh`` old.
    mutating func dueRefresh(now: Int64, continued: Int64?) -> Gathered? {
        guard keepsFatalReport, let session, let stall = session.stall, now - stall.lastWrite >= Self.fatalRefresh
        else { return nil }
        self.session?.stall?.lastWrite = now
        return Self.gathered(session, pace: pace, now: now, continued: continued)
    }
}
