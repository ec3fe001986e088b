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
public struct StallBacktrace: Sendable, CustomStringConvertible {
    /// The frames, innermost first. Empty when ``unavailableReason`` is set.
    public let frames: [StackFrame]
    /// The kernel id of the sampled thread, when there was one.
    public let threadID: Int32?
    /// Why there is no stack ("stack unavailable: …"), or nil.
    public let unavailableReason: String?

    /// A backtrace that could not be captured, with the reason.
    public static func unavailable(_ reason: String, threadID: Int32? = nil) -> StallBacktrace {
        StallBacktrace(frames: [], threadID: threadID, unavailableReason: reason)
    }

    /// One frame a line; "stack unavailable: <reason>" when there is none.
    public var description: String {
        if let unavailableReason { return "  stack unavailable: \(unavailableReason)" }
        var lines: [String] = []
        if let threadID { lines.append("  thread \(threadID):") }
        for (index, frame) in frames.enumerated() {
            lines.append("  #\(index) \(frame)")
        }
        return lines.joined(separator: "\n")
    }
}

/// One frame of a ``StallBacktrace``.
public struct StackFrame: Sendable, Hashable, CustomStringConvertible {
    /// The instruction address (for all but the first frame, a return address).
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
    /// is probably, not certainly, part of the live call chain.
    public let isUncertain: Bool

    /// `0x… function at file:line (image)`, with `?` for an uncertain frame.
    public var description: String {
        var text = "0x" + String(address, radix: 16).leftPadded(to: 12)
        text += " " + (function ?? "<unknown>")
        if let file {
            text += " at \(file)"
            if let line { text += ":\(line)" }
        }
        if let image { text += " (\(image))" }
        if isUncertain { text += " ?" }
        return text
    }
}

func format(_ duration: Duration) -> String {
    let (seconds, attoseconds) = duration.components
    let milliseconds = seconds * 1000 + attoseconds / 1_000_000_000_000_000
    let whole = milliseconds / 1000
    let fraction = String(milliseconds % 1000).leftPadded(to: 3)
    return "\(whole).\(fraction) s"
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
