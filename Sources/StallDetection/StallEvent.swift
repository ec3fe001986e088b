import SafeTimers

/// One report about one stall: it `started` (the threshold was crossed while the
/// target was still blocked) or it `ended` (the target answered again).
///
/// ```swift
/// for await event in detector.events {
///     switch event.phase {
///     case .started: logger.warning("\(event)")          // includes the blocked thread's stack
///     case .ended: metrics.record(event.duration)
///     }
/// }
/// ```
///
/// `String(describing:)` gives a readable report: the phase, the duration, and
/// the blocked thread's stack, one frame a line with function, file and line where
/// known.
public struct StallEvent: Sendable, CustomStringConvertible {
    /// Whether the stall is going on or over.
    public enum Phase: String, Sendable, Hashable {
        /// The target has been blocked for at least the threshold and still is.
        case started
        /// The target answered again; ``StallEvent/duration`` is the whole stall.
        case ended
    }

    /// The same for the `.started` and `.ended` events of one stall; increases
    /// from one stall to the next.
    public let id: UInt64
    /// Started or ended.
    public let phase: Phase
    /// How long the target had been blocked when the stall was detected
    /// (`.started`), or in total (`.ended`): measured, not the threshold.
    public let duration: Duration
    /// The threshold the detector was configured with.
    public let threshold: Duration
    /// What was watched, as text: "main run loop", "main queue" or the queue's label.
    public let target: String
    /// The blocked thread's stack, sampled when the stall started.
    public let backtrace: StallBacktrace
    /// How long sampling and symbolicating the stack took: a `.started` event is
    /// delivered that long after the stall was detected.
    public let samplingTime: Duration
    /// For ``StallDetector/Target/cooperativePool``: at `.started`, the stack of
    /// every thread that was running a Swift job (the blocked pool threads), the
    /// one in ``backtrace`` first. Empty otherwise.
    public internal(set) var poolBacktraces: [StallBacktrace] = []
    /// Where the time went: stack samples of the blocked thread taken every few
    /// milliseconds while the stall lasted, per function. On `.ended` the whole
    /// stall; on `.started` the samples so far. See ``StallProfile``.
    public internal(set) var profile: StallProfile = .empty
    /// The labels of ``StallDetector/withActivity(_:_:)`` active on the blocked
    /// thread when the stall was detected, outermost first; empty when none.
    public internal(set) var activities: [String] = []
    /// True for a report of a stall the process did not survive, as
    /// ``StallDetector/takeFatalStallReport(at:)`` reads it: ``duration`` and
    /// ``profile`` are as last written before the process ended.
    public internal(set) var endedWithProcess = false
    /// What was left out of this report to keep it under the fatal report's
    /// 16 MB (the longest activity labels first, then the profile's call tree,
    /// then its least-sampled functions), or nil when nothing was. Only a report read by
    /// ``StallDetector/takeFatalStallReport(at:)`` can have one.
    public internal(set) var truncationNote: String?

    /// A readable multi-line report: the phase and duration, the activities, the
    /// blocked thread's stack, and on `.ended` (or for a stall the process did not
    /// survive) a "where the time went" section from ``profile``.
    public var description: String {
        var text = "Stall #\(id) \(phase.rawValue): \(target) "
        switch phase {
        case _ where endedWithProcess:
            text =
                "Stall #\(id) never ended: \(target) was blocked for at least \(format(duration)) when the "
                + "process ended (threshold \(format(threshold)))"
        case .started: text += "blocked for \(format(duration)) when detected (threshold \(format(threshold)))"
        case .ended: text += "was blocked for \(format(duration)) (threshold \(format(threshold)))"
        }
        if !activities.isEmpty { text += "\n  activities: " + activities.joined(separator: " › ") }
        text += "\n" + backtrace.description
        if phase == .ended || endedWithProcess { text += "\n" + profile.description }
        if let truncationNote { text += "\n  (report cut to fit: \(truncationNote))" }
        return text
    }
}

/// The stack of a blocked thread, symbolicated.
///
/// Complete from the blocked function to the thread's start (`start_thread`,
/// `main`) whenever the stack could be read to its end: frames are never merged
/// or dropped, so a recursion 200 calls deep has 200 frames. The report prints a
/// run of identical frames on one line ("recurse(depth:) × 200"). A stack deeper
/// than ``maximumFrameCount`` keeps its innermost frames and its outermost ones,
/// and says how many are not shown.
public struct StallBacktrace: Sendable, CustomStringConvertible {
    /// The frames, innermost first. Empty when ``unavailableReason`` is set.
    public let frames: [StackFrame]
    /// The id of the sampled thread, when there was one: the kernel thread id
    /// (`gettid()`) on Linux. 64 bits wide so that one type also holds Darwin's
    /// `pthread_threadid_np` once Apple platforms sample stacks; nil there today.
    public let threadID: UInt64?
    /// Why there is no stack ("stack unavailable: …"), or nil.
    public let unavailableReason: String?
    /// How many frames between `frames[omittedIndex - 1]` and
    /// `frames[omittedIndex]` are not kept (a stack deeper than
    /// ``maximumFrameCount``); 0 when the stack is complete.
    public let omittedFrameCount: Int
    /// Where the omitted frames were, as an index into ``frames``; nil when none.
    public let omittedIndex: Int?
    /// Whether the stack copy ended before the thread's outermost frames, so that
    /// an unknown number of outer frames is missing.
    public let isTruncated: Bool

    /// The most frames a backtrace keeps: the innermost 768 and the outermost 256.
    public static let maximumFrameCount = 1024

    /// Set when the thread was running but could not be sampled (it blocks the
    /// signal, or did not answer it): a profile counts such a sample as time in
    /// unknown code rather than dropping it.
    var whileRunning = false

    init(
        frames: [StackFrame], threadID: UInt64?, unavailableReason: String?, isTruncated: Bool = false
    ) {
        self.threadID = threadID
        self.unavailableReason = unavailableReason
        self.isTruncated = isTruncated
        if frames.count > Self.maximumFrameCount {
            let outer = Self.maximumFrameCount / 4
            let inner = Self.maximumFrameCount - outer
            self.frames = Array(frames.prefix(inner) + frames.suffix(outer))
            self.omittedFrameCount = frames.count - Self.maximumFrameCount
            self.omittedIndex = inner
        } else {
            self.frames = frames
            self.omittedFrameCount = 0
            self.omittedIndex = nil
        }
    }

    /// A backtrace that could not be captured, with the reason.
    public static func unavailable(_ reason: String, threadID: UInt64? = nil) -> StallBacktrace {
        StallBacktrace(frames: [], threadID: threadID, unavailableReason: reason)
    }

    /// A running thread that could not be sampled (see ``whileRunning``).
    static func unavailableWhileRunning(_ reason: String, threadID: UInt64?) -> StallBacktrace {
        var backtrace = StallBacktrace(frames: [], threadID: threadID, unavailableReason: reason)
        backtrace.whileRunning = true
        return backtrace
    }

    /// One frame a line, a run of identical frames (recursion) on one line with its
    /// count, a repeated group of up to 4 frames once with its count; "… N frames not shown" where frames were left out; "stack
    /// unavailable: <reason>" when there is none.
    public var description: String {
        if let unavailableReason { return "  stack unavailable: \(unavailableReason)" }
        var lines: [String] = []
        if let threadID { lines.append("  thread \(threadID):") }
        var index = 0
        while index < frames.count {
            if index == omittedIndex { lines.append("  … \(omittedFrameCount) frames not shown") }
            let (unit, count) = repetition(at: index)
            if unit == 1 && count > 2 {
                lines.append("  #\(index)–#\(index + count - 1) \(frames[index]) × \(count)")
                index += count
            } else if unit > 1 {
                // A recursion through several functions (a closure and the function
                // it calls): the repeated group once, with its count.
                let end = index + unit * count
                lines.append("  #\(index)–#\(end - 1) × \(count), each time these \(unit) frames:")
                for position in index..<(index + unit) { lines.append("      \(frames[position])") }
                index = end
            } else {
                lines.append("  #\(index) \(frames[index])")
                index += 1
            }
        }
        if isTruncated { lines.append("  … outer frames not shown (the stack is deeper than the copy taken)") }
        return lines.joined(separator: "\n")
    }

    /// The shortest group of 1 to 4 frames that repeats from `start` (1 with a
    /// count of 1 when none does): a group of more than one frame must repeat at
    /// least 3 times. Never runs across the omitted frames.
    private func repetition(at start: Int) -> (unit: Int, count: Int) {
        let limit = omittedIndex.map { $0 > start ? $0 : frames.count } ?? frames.count
        func repeats(_ unit: Int) -> Int {
            var count = 1
            while start + (count + 1) * unit <= limit,
                (0..<unit).allSatisfy({ frames[start + count * unit + $0].sameCall(as: frames[start + $0]) })
            {
                count += 1
            }
            return count
        }
        let single = repeats(1)
        if single > 2 { return (1, single) }
        for unit in 2...4 where start + 3 * unit <= limit {
            let count = repeats(unit)
            if count >= 3 { return (unit, count) }
        }
        return (1, 1)
    }
}

/// One frame of a ``StallBacktrace``.
public struct StackFrame: Sendable, Hashable, CustomStringConvertible {
    /// The instruction address (for all but the first frame, a return address). A
    /// frame inlined into another has that frame's address.
    public let address: UInt
    /// The demangled function name, when the image has symbols.
    public let function: String?
    /// The source file, when the image has debug information.
    public let file: String?
    /// The source line, when known.
    public let line: Int?
    /// The image (executable or library) name.
    public let image: String?
    /// True for a frame found only by scanning the stack for return addresses: it
    /// is probably, not certainly, part of the live call chain. Such frames appear
    /// only beyond the point where the certain chain broke off.
    public let isUncertain: Bool
    /// True for a function the compiler inlined into the next frame of the list
    /// (which has the same address).
    public let isInlined: Bool
    /// ``address`` relative to the load address of ``image``, when the image is
    /// known: what offline symbolication needs (`llvm-symbolizer --obj=<image>
    /// 0x<offset>`, or `atos` with a dSYM on Apple platforms, where the report
    /// carries raw addresses with image names and offsets).
    public let imageOffset: UInt?

    init(
        address: UInt, function: String?, file: String?, line: Int?, image: String?, isUncertain: Bool,
        isInlined: Bool = false, imageOffset: UInt? = nil
    ) {
        self.address = address
        self.function = function
        self.file = file
        self.line = line
        self.image = image
        self.isUncertain = isUncertain
        self.isInlined = isInlined
        self.imageOffset = imageOffset
    }

    /// `0x… function at file:line (image)`, `[inlined]` for an inlined frame, `?`
    /// for an uncertain one; a frame without a name shows its image offset,
    /// `0x… <unknown> (image + 0x1f2c)`.
    public var description: String {
        var text = "0x" + String(address, radix: 16).leftPadded(to: 12)
        text += " " + (function ?? "<unknown>")
        if let file {
            text += " at \(file)"
            if let line { text += ":\(line)" }
        }
        if let image {
            if function == nil, let imageOffset {
                text += " (\(image) + 0x\(String(imageOffset, radix: 16)))"
            } else {
                text += " (\(image))"
            }
        }
        if isInlined { text += " [inlined]" }
        if isUncertain { text += " ?" }
        return text
    }

    /// The same call site: a recursion's repeated frame.
    func sameCall(as other: StackFrame) -> Bool {
        address == other.address && function == other.function && line == other.line
            && isInlined == other.isInlined && isUncertain == other.isUncertain
    }
}

func format(_ duration: Duration) -> String {
    let milliseconds = DeadlineArithmetic.nanoseconds(duration) / 1_000_000
    let whole = milliseconds / 1000
    let fraction = String(milliseconds % 1000).leftPadded(to: 3)
    return "\(whole).\(fraction) s"
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
