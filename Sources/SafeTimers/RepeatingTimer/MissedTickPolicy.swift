/// What a ``RepeatingTimer`` does with ticks that fall due while it cannot deliver
/// them: because the handler is still running (the handler falls behind), or
/// because the tick itself came late by more than an interval (the machine or the
/// process fell behind, for example after a long stop in a debugger).
///
/// Ticks stay on their grid in every policy: the deadlines are *start + k ×
/// interval*, and the next deadline is always the first grid point after now, so
/// the timer never drifts and never fires a burst of stale deadlines on its own.
/// The policies differ only in how many *handler invocations* the missed grid
/// points earn:
///
/// | policy | handler still running when a tick is due | tick arrives n intervals late |
/// |---|---|---|
/// | `.skip` | the tick is dropped | one invocation; n dropped |
/// | `.coalesce` | one invocation is owed, run as soon as the handler returns; more missed ticks add nothing | one invocation; n dropped |
/// | `.catchUp(limit:)` | each missed tick is owed; owed invocations run back to back after the handler returns, at most `limit` owed at once | one invocation plus n owed (at most `limit` owed) |
///
/// Invocations count toward `repetitions`: a finite timer always runs its handler
/// exactly `repetitions` times unless it is cancelled, whatever the policy.
public enum MissedTickPolicy: Sendable, Hashable {
    /// Drop missed ticks: at most one invocation per on-time tick.
    case skip
    /// Merge all missed ticks into one invocation, run as soon as possible (what
    /// `DispatchSourceTimer` does).
    case coalesce
    /// Run one invocation per missed tick, back to back, owing at most `limit`
    /// (a limit below 1 counts as 1).
    case catchUp(limit: Int)
}
