/// The samples of one stall as they were taken: raw stacks and their times
/// (monotonic nanoseconds), named only when a profile is wanted
/// (``profile(interval:naming:)``), so that taking a sample never waits for
/// debug information to be read.
///
/// Holds at most `capacity` samples, with ``ProfileRecorder``'s rule: when full,
/// every second sample goes and ``stride`` doubles (the pace that feeds it then
/// samples half as often), so the samples stay spread evenly over the whole
/// stall. A pure value.
struct RawProfile: Sendable {
    struct Sample: Sendable {
        var time: Int64
        var frames: [RawFrame]
    }

    let capacity: Int
    private(set) var samples: [Sample] = []
    /// One sample kept for every `stride` the pace would have taken at its
    /// shortest interval.
    private(set) var stride = 1
    /// The last look that kept a stack: its stack and when it was the thread's.
    /// The time after it is that stack's until the next look begins.
    private var previous: (frames: [RawFrame], seen: Int64)?
    /// Time seen by looks and not counted yet (nanoseconds; negative: counted
    /// ahead), less than one sample interval between looks.
    private(set) var owed: Double = 0

    init(capacity: Int = StallProfile.maximumSampleCount) {
        self.capacity = max(2, capacity)
    }

    var count: Int { samples.count }

    /// Adds one stack (innermost first).
    mutating func add(_ frames: [RawFrame], at time: Int64) {
        samples.append(Sample(time: time, frames: frames))
        if samples.count > capacity { thinOut() }
    }

    /// Adds a look of the sampler: it began at `start` (its signal was sent)
    /// and saw `frames` (nil: none of the target's) as they were at `seen`;
    /// `continued` is the latest continue after a stop, if any. Every sample
    /// stands for one sample interval (`baseInterval` × ``stride``) of time:
    ///
    /// - The previous look's stack counts for the time until this look began:
    ///   the sampler's own wait for a core, which is longest while the target
    ///   runs, belongs to the stack it last saw.
    /// - This look's stack counts once at once, and once more for every
    ///   interval its thread took to answer (a running thread answers its
    ///   signal only when it gets a core, and ran nothing meanwhile: its stack
    ///   stood for that time).
    ///
    /// What is left over carries to the next look (gaps of 1.45 intervals count
    /// 1.45 on average, not 1); the time the process was stopped does not
    /// count; one stretch counts for a quarter of the capacity at most; a
    /// profile thinned out meanwhile counts the rest at the doubled interval.
    /// Counted once a look instead, a busy phase sampled late lost half its
    /// share beside a sleeping one read at once.
    mutating func add(
        look frames: [RawFrame]?, start: Int64, seen: Int64, continued: Int64?, baseInterval: Int64
    ) {
        let base = Double(max(1, baseInterval))
        countPrevious(until: start, continued: continued, base: base)
        guard let frames else {
            (previous, owed) = (nil, 0)
            return
        }
        // Once now for the time ahead (paid back by the next look), and for
        // the time the thread took to answer, the copies an interval apart up
        // to `seen`; at least once (a stop's time, or looks closer than an
        // interval, may have left the time counted ahead).
        let ahead = base * Double(stride)
        owed += Double(max(0, seen - max(start, continued ?? start))) + ahead
        let added = spend(frames, base: base) { unit, left in
            max(start, seen - Int64(min(Double(Int64.max / 4), (max(0, left) / unit).rounded(.down) * unit)))
        }
        if added == 0 {
            add(frames, at: seen)
            owed -= base * Double(stride)
        }
        // What was counted ahead is paid back by the time after it.
        owed = max(-Double(max(1, capacity / 4)) * base * Double(stride), owed - ahead)
        previous = (frames, seen)
    }

    /// The profile at `time` (the stall's end, or now while it lasts): the
    /// last look's stack counts for the time since it, as the next look would
    /// count it.
    func closed(at time: Int64, continued: Int64?, baseInterval: Int64) -> RawProfile {
        var closed = self
        closed.countPrevious(until: time, continued: continued, base: Double(max(1, baseInterval)))
        closed.previous = nil
        return closed
    }

    /// Counts the last look's stack for the time from it until `time` (less a
    /// stop before `continued`), the copies an interval apart after it.
    private mutating func countPrevious(until time: Int64, continued: Int64?, base: Double) {
        guard let previous else { return }
        owed += Double(max(0, time - max(previous.seen, continued ?? previous.seen)))
        var copyTime = previous.seen
        spend(previous.frames, base: base) { unit, _ in
            copyTime = min(time, copyTime + Int64(min(unit, Double(Int64.max / 4))))
            return copyTime
        }
    }

    /// Adds `frames` once for every sample interval of ``owed`` (a quarter of
    /// the capacity at most; the interval doubles with the stride when the
    /// profile is thinned out meanwhile), each at `time(interval, owed after
    /// it)`; what is left, under an interval, stays owed.
    @discardableResult
    private mutating func spend(_ frames: [RawFrame], base: Double, at time: (Double, Double) -> Int64) -> Int {
        let most = max(1, capacity / 4)
        var unit = base * Double(stride)
        owed = min(owed, Double(most) * unit)
        var added = 0
        while owed >= unit && added < most {
            owed -= unit
            add(frames, at: time(unit, owed))
            added += 1
            unit = base * Double(stride)
        }
        owed = min(owed, unit)
        return added
    }

    /// Drops the samples taken before `time` (before the stall began); a
    /// look from before it no longer counts for the time after it.
    mutating func dropSamples(before time: Int64) {
        samples.removeAll { $0.time < time }
        if let previous, previous.seen < time { (self.previous, owed) = (nil, 0) }
    }

    /// Drops the samples taken after `time` (after the stall ended).
    mutating func dropSamples(after time: Int64) {
        guard let last = samples.last, last.time > time else { return }
        samples.removeAll { $0.time > time }
    }

    /// Keeps every second sample and doubles the stride.
    mutating func thinOut() {
        samples = samples.enumerated().filter { $0.offset % 2 == 0 }.map(\.element)
        stride *= 2
    }

    /// The profile of the samples held, each distinct stack named once by
    /// `naming` (many samples of a stall share a stack); `interval` is the pace's
    /// current interval.
    func profile(interval: Int64, naming: ([[RawFrame]]) -> [[StackFrame]]) -> StallProfile {
        var distinct: [[RawFrame]: Int] = [:]
        var stacks: [[RawFrame]] = []
        for sample in samples where distinct[sample.frames] == nil {
            distinct[sample.frames] = stacks.count
            stacks.append(sample.frames)
        }
        let named = naming(stacks)
        var recorder = ProfileRecorder(capacity: max(capacity, samples.count))
        for sample in samples {
            guard let index = distinct[sample.frames], index < named.count else { continue }
            recorder.add(named[index], at: sample.time)
        }
        return recorder.profile(interval: interval)
    }
}
