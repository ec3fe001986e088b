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
        /// The target answered again, and ``StallEvent/duration`` is the whole
        /// stall; or the detector was stopped during the stall
        /// (``StallEvent/endedByStop``), and it is the time blocked until the stop.
        case ended
    }

    /// The same for the `.started` and `.ended` events of one stall; increases
    /// from one stall to the next. A number can be skipped: a late answer that
    /// no look saw in time is dropped when nothing shows the target ran its own
    /// code meanwhile (the process got no CPU, or was stopped), and it had
    /// taken the next number.
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
    public internal(set) var backtrace: StallBacktrace
    /// How long sampling and symbolicating the stack took: a `.started` event is
    /// delivered that long after the stall was detected.
    public let samplingTime: Duration
    /// For ``StallDetector/Target/cooperativePool``: at `.started`, the stack of
    /// every thread of the pool that was running a Swift job (the blocked pool
    /// threads), and on Linux then every one running a global-queue block (the
    /// pool's threads are the global queue's there), the one in ``backtrace``
    /// first. Empty otherwise.
    public internal(set) var poolBacktraces: [StallBacktrace] = []
    /// Where the time went: stack samples of the blocked thread taken every few
    /// milliseconds while the stall lasted, per function. On `.ended` the whole
    /// stall; on `.started` the samples so far. See ``StallProfile``.
    public internal(set) var profile: StallProfile = .empty
    /// The labels of ``StallDetector/withActivity(_:_:)`` active on the blocked
    /// thread when the stall was detected, outermost first; empty when none.
    public internal(set) var activities: [String] = []
    /// True for the `.ended` event of a stall that ``StallDetector/stop()`` cut
    /// short: the target had not answered when the detector stopped, and
    /// ``duration`` is how long it had been blocked by then (it may be blocked
    /// still). A detector stopped during a stall it reported `.started` for ends
    /// the stall with this event, the last the ``StallDetector/events`` stream
    /// yields; the `onEvent` handler gets it too, before `stop()` returns, unless
    /// `stop()` was called from that handler. False for every other event.
    public internal(set) var endedByStop = false
    /// True for a report of a stall the process did not survive, as
    /// ``StallDetector/takeFatalStallReport(at:)`` reads it: ``duration`` and
    /// ``profile`` are as last written before the process ended.
    public internal(set) var endedWithProcess = false
    /// What was left out of this report to keep it under the fatal report's
    /// 16 MB (the longest activity labels first, then the profile's call tree,
    /// then its least-sampled functions), or nil when nothing was. Only a report read by
    /// ``StallDetector/takeFatalStallReport(at:)`` can have one.
    public internal(set) var truncationNote: String?
    /// On a `.started` event found later than the threshold plus one heartbeat
    /// after the stall began: how late, and what held the detector up (its
    /// threads waited to run, a second look, sampling). Nil on time, and on
    /// every `.ended` event. See ``Lateness``.
    public internal(set) var lateness: Lateness?
    /// The name of the Swift task running on the blocked thread
    /// (``StallBacktrace/task``), when it has one: the pprof export labels
    /// samples `task_name` with it.
    var taskName: String? { backtrace.task?.name }

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
        case .ended where endedByStop:
            text +=
                "was blocked for at least \(format(duration)) when the detector stopped (threshold \(format(threshold)))"
        case .ended: text += "was blocked for \(format(duration)) (threshold \(format(threshold)))"
        }
        if let lateness { text += "\n  \(lateness)" }
        if !activities.isEmpty { text += "\n  activities: " + activities.joined(separator: " › ") }
        text += "\n" + backtrace.description
        if phase == .ended || endedWithProcess { text += "\n" + profile.description }
        if let truncationNote { text += "\n  (report cut to fit: \(truncationNote))" }
        return text
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
