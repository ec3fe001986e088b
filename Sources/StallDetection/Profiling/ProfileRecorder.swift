/// The samples of one stall and their per-function counts: a pure value, fed
/// with symbolicated stacks and times (monotonic nanoseconds).
///
/// Holds at most `capacity` samples: when full, every second sample goes and
/// ``stride`` doubles (the pace that feeds it then samples half as often), so the
/// samples stay spread evenly over the whole stall. Counts are kept up to date on
/// every change, so a ``profile(interval:)`` costs a sort of the functions only.
struct ProfileRecorder: Sendable {
    struct Key: Hashable, Sendable {
        var name: String
        var image: String?
    }

    struct Entry: Sendable {
        var function: Int
        var line: Int?
        /// Position among the sample's distinct functions, innermost 0.
        var position: Int
    }

    struct Sample: Sendable {
        var time: Int64
        var entries: [Entry]
        /// Every named frame's function, innermost first (a recursion once per
        /// call): the sample's path in the call tree.
        var path: [Int]
    }

    private struct Info: Sendable {
        var key: Key
        var file: String?
        var samples = 0
        var positionSum = 0
        var lines: [Int: Int] = [:]
    }

    let capacity: Int
    private(set) var samples: [Sample] = []
    /// One sample kept for every `stride` the pace would have taken at its
    /// shortest interval.
    private(set) var stride = 1
    private var table: [Key: Int] = [:]
    private var infos: [Info] = []
    /// The functions each run of frames at one address names.
    private var groups: [GroupKey: [(function: Int, line: Int?)]] = [:]
    /// The last sample (by `stamp`) each function was counted in.
    private var lastStamp: [UInt64] = []
    private var stamp: UInt64 = 0

    init(capacity: Int = StallProfile.maximumSampleCount) {
        self.capacity = max(2, capacity)
    }

    var count: Int { samples.count }

    /// Adds one stack (innermost first); frames found only by a scan are ignored.
    ///
    /// The frames of one address (those inlined there, then the frame they are
    /// inlined into) name the same functions every time: they are looked up by
    /// address once, then by name never again.
    mutating func add(_ frames: [StackFrame], at time: Int64) {
        stamp &+= 1
        var entries: [Entry] = []
        var path: [Int] = []
        var groupStart = 0
        var isFirst = true
        while groupStart < frames.count {
            var groupEnd = groupStart
            while groupEnd < frames.count - 1 && frames[groupEnd].isInlined
                && frames[groupEnd + 1].address == frames[groupStart].address
            {
                groupEnd += 1
            }
            defer {
                groupStart = groupEnd + 1
                isFirst = false
            }
            let group = frames[groupStart...groupEnd]
            if frames[groupEnd].isUncertain { continue }
            let key = GroupKey(address: frames[groupStart].address, isFirst: isFirst, count: group.count)
            let named: [(function: Int, line: Int?)]
            if let known = groups[key] {
                named = known
            } else {
                named = group.map { (function(for: $0), $0.function == nil ? nil : $0.line) }
                if groups.count < 100_000 { groups[key] = named }
            }
            for (function, line) in named {
                path.append(function)
                guard lastStamp[function] != stamp else { continue }
                lastStamp[function] = stamp
                entries.append(Entry(function: function, line: line, position: entries.count))
            }
        }
        if path.count > StallProfile.maximumStackDepth {
            let outer = StallProfile.maximumStackDepth / 4
            path = Array(path.prefix(StallProfile.maximumStackDepth - outer) + path.suffix(outer))
        }
        let sample = Sample(time: time, entries: entries, path: path)
        count(sample, sign: 1)
        samples.append(sample)
        if samples.count > capacity { thinOut() }
    }

    private struct GroupKey: Hashable, Sendable {
        var address: UInt
        var isFirst: Bool
        var count: Int
    }

    private mutating func function(for frame: StackFrame) -> Int {
        let key = Key(name: frame.function ?? "<unknown>", image: frame.image)
        if let known = table[key] { return known }
        table[key] = infos.count
        infos.append(Info(key: key, file: frame.function == nil ? nil : frame.file))
        lastStamp.append(0)
        return infos.count - 1
    }

    /// Drops the samples taken before `time` (before the stall began).
    mutating func dropSamples(before time: Int64) {
        let kept = samples.filter { $0.time >= time }
        for sample in samples where sample.time < time { count(sample, sign: -1) }
        samples = kept
    }

    /// Keeps every second sample and doubles the stride.
    mutating func thinOut() {
        var kept: [Sample] = []
        kept.reserveCapacity(samples.count / 2 + 1)
        for (index, sample) in samples.enumerated() {
            if index % 2 == 0 { kept.append(sample) } else { count(sample, sign: -1) }
        }
        samples = kept
        stride *= 2
    }

    private mutating func count(_ sample: Sample, sign: Int) {
        for entry in sample.entries {
            infos[entry.function].samples += sign
            infos[entry.function].positionSum += sign * entry.position
            if let line = entry.line { infos[entry.function].lines[line, default: 0] += sign }
        }
    }

    /// The profile of the samples held; `interval` is the pace's current interval.
    func profile(interval: Int64) -> StallProfile {
        let span = (samples.last?.time ?? 0) - (samples.first?.time ?? 0)
        let ranked = infos.filter { $0.samples > 0 }.sorted { left, right in
            if left.samples != right.samples { return left.samples > right.samples }
            // Average position: the callee (nearer the top of the stack) first.
            let leftRank = left.positionSum * right.samples
            let rightRank = right.positionSum * left.samples
            if leftRank != rightRank { return leftRank < rightRank }
            return left.key.name < right.key.name
        }
        let functions = ranked.map { info in
            let line = info.lines.filter { $0.value > 0 }.max { left, right in
                left.value != right.value ? left.value < right.value : left.key > right.key
            }?.key
            return StallProfile.Function(
                name: info.key.name, file: info.file, line: line, image: info.key.image, samples: info.samples)
        }
        return StallProfile(
            sampleCount: samples.count, functions: functions, interval: .nanoseconds(interval),
            span: .nanoseconds(max(0, span)), stacks: stacks(ranking: ranked.map(\.key)))
    }

    /// The distinct paths of the samples held, root first, as positions in the
    /// ranked functions, with how many samples took each; most samples first,
    /// then in the order of the paths.
    private func stacks(ranking: [Key]) -> [StallProfile.Stack] {
        var rank: [Int] = Array(repeating: -1, count: infos.count)
        let position = Dictionary(uniqueKeysWithValues: ranking.enumerated().map { ($0.element, $0.offset) })
        for (index, info) in infos.enumerated() { rank[index] = position[info.key] ?? -1 }
        var counts: [[Int]: Int] = [:]
        for sample in samples {
            let path = sample.path.reversed().map { rank[$0] }
            guard !path.contains(-1) else { continue }
            counts[path, default: 0] += 1
        }
        return counts.map { StallProfile.Stack(functionIndices: $0.key, samples: $0.value) }.sorted { left, right in
            left.samples != right.samples
                ? left.samples > right.samples : left.functionIndices.lexicographicallyPrecedes(right.functionIndices)
        }
    }
}
