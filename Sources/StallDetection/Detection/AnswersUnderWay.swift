import Synchronization

/// The answers of one detector that have read their time and are not recorded
/// yet: a probe's block, or a run-loop activity, between reading the clock and
/// taking the detector's lock (a thread can be descheduled in between, or wait
/// for the lock a look holds).
///
/// A look that read its own time first and then finds none under way knows
/// that every answer not recorded yet will read a later time: a stall it opens
/// lasted at least until then, and its `.ended` cannot be shorter than its
/// `.started`. A look that finds one under way does not decide
/// (``DetectorMachine/look(now:continued:answering:)``).
final class AnswersUnderWay: Sendable {
    private let count = Atomic<Int>(0)

    /// Counts an answer, reads its time, and runs `record` with it; the count
    /// drops once `record` returned.
    func answer<Result>(_ record: (_ time: Int64) -> Result) -> Result {
        count.add(1, ordering: .sequentiallyConsistent)
        defer { count.subtract(1, ordering: .sequentiallyConsistent) }
        return record(Monotonic.now())
    }

    /// Whether an answer is under way; read after the look's own time.
    var any: Bool { count.load(ordering: .sequentiallyConsistent) > 0 }
}
