/// Where a stall's time went: stack samples of the blocked thread, taken every few
/// milliseconds while the stall lasted, counted per function.
///
/// ```swift
/// for await event in detector.events where event.phase == .ended {
///     for function in event.profile.functions.prefix(5) {
///         print(function.samples, "of", event.profile.sampleCount, function.name)
///     }
/// }
/// ```
///
/// On `.ended` the profile covers the whole stall, from the first sample after it
/// began (a detector starts sampling as soon as an answer is a little late, before
/// the threshold is crossed, its first stall too) to its end; on `.started` it
/// holds what was sampled so far.
/// Each function counts the samples whose stack contains it (a recursion counts
/// once per sample), so a function and its callers can all have most samples.
///
/// The samples' stacks are kept too, aggregated: ``stacks`` (each distinct
/// stack, root to leaf, with its count) and ``callTree`` (who called whom, with
/// the samples of each call path). Profilers open them as ``foldedStacks()``
/// (flamegraph.pl, inferno, speedscope; `swift run stall-flamegraph` in this
/// package draws an SVG) and ``speedscopeJSON(title:)``:
///
/// ```swift
/// for await event in detector.events where event.phase == .ended {
///     try event.profile.foldedStacks().write(toFile: "stall.folded", atomically: true, encoding: .utf8)
///     print(event.profile.callTree)
/// }
/// ```
///
/// Sampling is bounded: at most ``maximumSampleCount`` samples (a long stall keeps
/// every second sample and halves the rate, so the samples stay spread over the
/// whole stall), and at most 2 % of one core (4 % in a debug build): a token
/// bucket of CPU time refills at that rate and each sample spends what it cost;
/// samples are at least ``minimumInterval`` apart.
public struct StallProfile: Sendable, Hashable, CustomStringConvertible {
    /// One function of the profile.
    public struct Function: Sendable, Hashable {
        /// The demangled name, or "<unknown>" for code without symbols.
        public let name: String
        /// The source file, when the image has debug information.
        public let file: String?
        /// The line seen in most of this function's samples, when known.
        public let line: Int?
        /// The image (executable or library) the function is in.
        public let image: String?
        /// How many samples had this function on their stack.
        public let samples: Int
    }

    /// How many samples the profile holds.
    public let sampleCount: Int
    /// The functions seen, most samples first; among equal counts, the one nearer
    /// the top of the stack (the callee) first.
    public let functions: [Function]
    /// The time between two samples at the end (it grows when a long stall is
    /// thinned out, or when samples are costly).
    public let interval: Duration
    /// The time from the first sample to the last.
    public let span: Duration

    /// The most samples a profile keeps: 500.
    public static let maximumSampleCount = 500
    /// The most functions a stack of ``stacks`` keeps, as a backtrace does: a
    /// deeper one keeps its innermost 768 and its outermost 256.
    public static let maximumStackDepth = StallBacktrace.maximumFrameCount
    /// The shortest time between two samples: 5 ms.
    public static let minimumInterval = Duration.milliseconds(5)

    /// The sampled stacks, aggregated: each distinct stack (root to leaf) with
    /// how many samples had exactly it, most samples first. The same samples as
    /// ``functions``, kept whole: ``callTree`` is built from them, and
    /// ``foldedStacks()`` and ``speedscopeJSON(title:)`` export them.
    public let stacks: [Stack]

    /// A profile with no samples.
    public static let empty = StallProfile(sampleCount: 0, functions: [], interval: .zero, span: .zero)

    init(sampleCount: Int, functions: [Function], interval: Duration, span: Duration, stacks: [Stack] = []) {
        self.sampleCount = sampleCount
        self.functions = functions
        self.interval = interval
        self.span = span
        self.stacks = stacks
    }

    /// The fraction of samples (0…1) that had `function` on their stack.
    public func share(of function: Function) -> Double {
        sampleCount == 0 ? 0 : Double(function.samples) / Double(sampleCount)
    }

    /// The "where the time went" section: one function a line with its share of
    /// the samples and file:line. Functions seen in every sample beyond the
    /// innermost few are summarised in one line, and at most 16 lines follow.
    public var description: String {
        guard sampleCount > 0 else { return "  where the time went: no samples" }
        var lines = [
            "  where the time went (\(sampleCount) sample\(sampleCount == 1 ? "" : "s") over \(format(span)), "
                + "one every \(formatMilliseconds(interval))):"
        ]
        let everywhere = functions.prefix { $0.samples == sampleCount }
        let shownEverywhere = 5
        var shown = 0
        for (index, function) in functions.enumerated() {
            if index == shownEverywhere && everywhere.count > shownEverywhere {
                lines.append("           … and \(everywhere.count - shownEverywhere) callers in every sample")
            }
            if index >= shownEverywhere && index < everywhere.count { continue }
            if shown == 16 {
                lines.append("           … \(functions.count - index) more functions")
                break
            }
            lines.append("  " + Self.percent(share(of: function)) + "  " + Self.describe(function))
            shown += 1
        }
        return lines.joined(separator: "\n")
    }

    static func describe(_ function: Function) -> String {
        var text = function.name
        if let file = function.file {
            text += " at \(file)"
            if let line = function.line { text += ":\(line)" }
        }
        if let image = function.image { text += " (\(image))" }
        return text
    }

    /// "100.0 %", " 66.7 %": fixed width.
    static func percent(_ share: Double) -> String {
        let tenths = Int((share * 1000).rounded())
        let text = "\(tenths / 10).\(tenths % 10) %"
        return String(repeating: " ", count: max(0, 7 - text.count)) + text
    }
}

func formatMilliseconds(_ duration: Duration) -> String {
    let microseconds = Monotonic.nanoseconds(duration) / 1_000
    let whole = microseconds / 1000
    let fraction = String(microseconds % 1000 / 100)
    return "\(whole).\(fraction) ms"
}

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

extension String {
    /// Whether `text` occurs in this string, byte for byte (UTF-8): the stack
    /// shape checks run on every profile sample, and Foundation's `contains`
    /// (which the module sees) bridges through `NSString` for each call.
    func containsText(_ text: String) -> Bool {
        var haystack = self
        var needle = text
        return haystack.withUTF8 { hay in
            needle.withUTF8 { pattern in
                guard !pattern.isEmpty else { return true }
                guard pattern.count <= hay.count else { return false }
                let first = pattern[0]
                var index = 0
                let last = hay.count - pattern.count
                while index <= last {
                    if hay[index] == first {
                        var matched = 1
                        while matched < pattern.count && hay[index + matched] == pattern[matched] { matched += 1 }
                        if matched == pattern.count { return true }
                    }
                    index += 1
                }
                return false
            }
        }
    }
}
