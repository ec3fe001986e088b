/// How many beats of the heartbeat pass between two probes of one detector: one,
/// or more while its target answers promptly (``StallDetector``'s `idleHeartbeat`).
///
/// The spacing doubles after ``promptAnswersToWiden`` prompt answers in a row,
/// up to ``widest``, and is back to one beat at the first answer that is not
/// prompt, and at a beat that finds a probe still unanswered. A prompt answer
/// came at most a quarter of a heartbeat after it was owed: an idle target's
/// wake-up, not a backlog.
///
/// Pure: the detector's machine keeps it and feeds it the lags it measures.
struct ProbeSpacing: Sendable, Equatable {
    /// Prompt answers in a row after which the spacing doubles.
    static let promptAnswersToWiden = 4

    /// The widest spacing, in beats (1: never wider than the heartbeat).
    let widest: Int64
    /// The spacing now, in beats: 1 to ``widest``.
    private(set) var beats: Int64 = 1
    private var promptAnswers = 0

    /// `widest`: the widest spacing in beats (below 1 counts as 1).
    init(widest: Int64) {
        self.widest = max(1, widest)
    }

    /// Whether an answer `lag` nanoseconds after it was owed is prompt, at a
    /// heartbeat of `heartbeat` nanoseconds.
    static func isPrompt(lag: Int64, heartbeat: Int64) -> Bool {
        lag <= heartbeat / 4
    }

    /// An answer came `lag` nanoseconds after it was owed (nil: nothing was
    /// owed, which neither widens nor narrows).
    mutating func answered(lag: Int64?, heartbeat: Int64) {
        guard widest > 1, let lag else { return }
        guard Self.isPrompt(lag: lag, heartbeat: heartbeat) else {
            narrow()
            return
        }
        promptAnswers += 1
        guard promptAnswers >= Self.promptAnswersToWiden, beats < widest else { return }
        beats = min(beats * 2, widest)
        promptAnswers = 0
    }

    /// Back to one beat: an answer was late, a probe went unanswered for a
    /// beat, or a stall began.
    mutating func narrow() {
        beats = 1
        promptAnswers = 0
    }
}
