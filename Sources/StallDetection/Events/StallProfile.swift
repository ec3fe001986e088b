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
/// whole stall), and at most 3 % of one core (4 % in a debug build): a token
/// bucket of CPU time refills at that rate and each sample spends what it cost;
/// the sampler looks at the thread at most once every ``minimumInterval``.
///
/// Counts are counts of time: every sample stands for one ``interval``, so
/// ``sampleCount`` × ``interval`` is about the time the profile covers. A look's
/// stack counts once, and once more for every interval its thread took to
/// answer the sampling signal (on a loaded machine a running thread answers
/// only when it gets a core again, and it ran nothing meanwhile); the time
/// until the next look (the sampler's own wait for a core included) counts for
/// the stack the last look saw, up to the stall's end. Remainders carry to the
/// next look, the time the process was stopped does not count, and one stretch
/// counts for a quarter of ``maximumSampleCount`` at most. Counted once a look
/// instead, a busy phase sampled late lost half its share beside a sleeping one
/// (read at once). Samples from after the target answered are left out.
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
