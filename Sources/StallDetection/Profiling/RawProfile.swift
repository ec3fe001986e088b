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

    init(capacity: Int = StallProfile.maximumSampleCount) {
        self.capacity = max(2, capacity)
    }

    var count: Int { samples.count }

    /// Adds one stack (innermost first).
    mutating func add(_ frames: [RawFrame], at time: Int64) {
        samples.append(Sample(time: time, frames: frames))
        if samples.count > capacity { thinOut() }
    }

    /// Adds one stack for the time since the sampler's previous look (`gap`):
    /// once per `interval` of the pace that passed, at least once and at most a
    /// quarter of the capacity (one look after a long pause must not crowd out
    /// the rest), the copies spread back from `time` an interval apart.
    ///
    /// On a loaded machine a running thread answers its signal only when it gets
    /// a core, while a sleeping one is read at once: a look at running code
    /// comes late. Its stack could not change while it waited (the thread ran no
    /// code), so it stands for the whole wait; counted once, a busy phase would
    /// get a smaller share than its share of the time.
    mutating func add(_ frames: [RawFrame], at time: Int64, standingFor gap: Int64, interval: Int64) {
        let interval = max(1, interval)
        let periods = (Double(max(0, gap)) / Double(interval)).rounded()
        let copies = Int(min(Double(max(1, capacity / 4)), max(1, periods)))
        for copy in 0..<copies {
            add(frames, at: time - Int64(copies - 1 - copy) * interval)
        }
    }

    /// Drops the samples taken before `time` (before the stall began).
    mutating func dropSamples(before time: Int64) {
        samples.removeAll { $0.time < time }
    }

    /// Drops the samples taken after `time` (after the stall ended).
    mutating func dropSamples(after time: Int64) {
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
