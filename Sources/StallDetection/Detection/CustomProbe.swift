import CStallCapture

/// One probe handed to a ``StallDetector/Target/custom(name:post:)`` target's
/// `post` closure: it reports its first run, and its release without a run.
///
/// The user's code decides what happens to the closure that wraps it: it may run
/// it on the executor (the intended use), run it inline inside `post`, run it
/// twice, drop it, or keep it forever. `outcome` is called exactly once: with
/// where and when it ran (``ProbeAnswer/here()``, the time read first, before
/// any lock) at the first run, or with nil when the probe is released without
/// ever having run. A run is marked as a probe's (`stallcapture_probe_begin`):
/// a sample of the thread meanwhile is no stall's. It holds the detector
/// weakly, so a kept probe keeps nothing alive but itself and the detector's
/// small answer count: a run is counted in `answers` from before its time is
/// read until `outcome` returned.
final class CustomProbe: Sendable {
    private let hasRun = Locked(false)
    private let answers: AnswersUnderWay
    private let outcome: @Sendable (_ answer: ProbeAnswer?, _ time: Int64) -> Void

    init(
        answers: AnswersUnderWay, outcome: @escaping @Sendable (_ answer: ProbeAnswer?, _ time: Int64) -> Void
    ) {
        self.answers = answers
        self.outcome = outcome
    }

    /// The closure handed to `post`.
    var closure: @Sendable () -> Void {
        { [self] in run() }
    }

    private func run() {
        stallcapture_probe_begin()
        defer { stallcapture_probe_end() }
        answers.answer { time in
            let first = hasRun.withLock { hasRun in
                let first = !hasRun
                hasRun = true
                return first
            }
            if first { outcome(.here(), time) }
        }
    }

    deinit {
        // The last reference is gone, so nothing runs concurrently.
        if !hasRun.withLock({ $0 }) { outcome(nil, Monotonic.now()) }
    }
}
