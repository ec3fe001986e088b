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

    /// A readable multi-line report.
    public var description: String {
        var text = "Stall #\(id) \(phase.rawValue): \(target) "
        switch phase {
        case .started: text += "blocked for \(format(duration)) when detected (threshold \(format(threshold)))"
        case .ended: text += "was blocked for \(format(duration)) (threshold \(format(threshold)))"
        }
        text += "\n" + backtrace.description
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
    /// (`gettid()`) on Linux, `pthread_threadid_np` on Darwin. 64 bits wide so
    /// that one type holds both.
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

    /// One frame a line, a run of identical frames (recursion) on one line with its
    /// count; "… N frames not shown" where frames were left out; "stack
    /// unavailable: <reason>" when there is none.
    public var description: String {
        if let unavailableReason { return "  stack unavailable: \(unavailableReason)" }
        var lines: [String] = []
        if let threadID { lines.append("  thread \(threadID):") }
        var index = 0
        while index < frames.count {
            if index == omittedIndex { lines.append("  … \(omittedFrameCount) frames not shown") }
            var end = index + 1
            while end < frames.count, end != omittedIndex, frames[end].sameCall(as: frames[index]) { end += 1 }
            if end - index > 2 {
                lines.append("  #\(index)–#\(end - 1) \(frames[index]) × \(end - index)")
            } else {
                for position in index..<end { lines.append("  #\(position) \(frames[position])") }
            }
            index = end
        }
        if isTruncated { lines.append("  … outer frames not shown (the stack is deeper than the copy taken)") }
        return lines.joined(separator: "\n")
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

    init(
        address: UInt, function: String?, file: String?, line: Int?, image: String?, isUncertain: Bool,
        isInlined: Bool = false
    ) {
        self.address = address
        self.function = function
        self.file = file
        self.line = line
        self.image = image
        self.isUncertain = isUncertain
        self.isInlined = isInlined
    }

    /// `0x… function at file:line (image)`, `[inlined]` for an inlined frame, `?`
    /// for an uncertain one.
    public var description: String {
        var text = "0x" + String(address, radix: 16).leftPadded(to: 12)
        text += " " + (function ?? "<unknown>")
        if let file {
            text += " at \(file)"
            if let line { text += ":\(line)" }
        }
        if let image { text += " (\(image))" }
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
