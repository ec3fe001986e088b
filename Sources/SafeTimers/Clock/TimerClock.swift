/// The `Clock` of a ``TimerScheduler``: async code sleeps on the same engine as
/// the scheduler's timers, and under a `ManualTimerScheduler` a test moves it by
/// hand.
///
/// ```swift
/// let clock = SystemTimerScheduler.shared.clock
/// try await clock.sleep(for: .milliseconds(50))
/// try await Task.sleep(for: .seconds(1), clock: clock)
///
/// // In a test:
/// let manual = ManualTimerScheduler()
/// let task = Task { try await manual.clock.sleep(for: .seconds(5)); done() }
/// await manual.waitForSleepers(1)     // the task is suspended in its sleep
/// manual.advance(by: .seconds(5))     // resumes it
/// ```
///
/// Because it is a `Clock`, anything written against `Clock` runs on it:
/// `Task.sleep(for:tolerance:clock:)`, swift-async-algorithms' `debounce(for:clock:)`
/// and `AsyncTimerSequence`, or your own code.
///
/// A sleep arms one wheel entry: O(1), no allocation beyond the sleeping task's
/// bookkeeping, and no thread hop when it ends (the scheduler thread resumes the
/// task directly). A cancelled task's sleep throws `CancellationError` and frees
/// its entry at once.
///
/// The system scheduler's clock is monotonic (see ``SystemTimerScheduler``); a
/// manual scheduler's is virtual. Instants of two different schedulers' clocks
/// are not comparable in meaning (each counts from its scheduler's creation).
///
/// Thread safety: a value type; every member may be used from any thread.
public struct TimerClock: Clock, Sendable {
    /// A point in time on a ``TimerClock``: nanoseconds since its scheduler was
    /// created. Arithmetic saturates: an instant never overflows, and the far end
    /// means "never".
    public struct Instant: InstantProtocol, Sendable, Hashable, Comparable, CustomStringConvertible {
        /// Nanoseconds since the scheduler was created.
        let ticks: Int64

        init(ticks: Int64) {
            self.ticks = ticks
        }

        /// The instant `duration` after this one (saturating).
        public func advanced(by duration: Duration) -> Instant {
            Instant(ticks: DeadlineArithmetic.adding(DeadlineArithmetic.nanoseconds(duration), to: ticks))
        }

        /// The time from this instant to `other` (negative if `other` is earlier).
        public func duration(to other: Instant) -> Duration {
            .nanoseconds(Int128(other.ticks) - Int128(ticks))
        }

        /// The time since the scheduler was created.
        public var sinceCreation: Duration { .nanoseconds(ticks) }

        /// Whether `lhs` comes before `rhs`.
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.ticks < rhs.ticks }

        /// The time since the scheduler was created, as a duration.
        public var description: String { "TimerClock.Instant(\(sinceCreation) since creation)" }
    }

    let engine: TimerEngine

    init(engine: TimerEngine) {
        self.engine = engine
    }

    /// The current instant.
    public var now: Instant { Instant(ticks: engine.nowTicks) }

    /// One nanosecond: the engine keeps deadlines to the nanosecond (how late a
    /// real wake-up comes depends on the machine, not on this value).
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// Suspends the current task until `deadline` (plus at most `tolerance`).
    ///
    /// Throws `CancellationError` if the task is cancelled first, or already is;
    /// the engine entry is freed at once. A deadline already past returns at once,
    /// without suspending, as with `ContinuousClock` and swift-clocks'
    /// `TestClock`; a deadline equal to ``now`` returns at the scheduler's next
    /// firing (under `ManualTimerScheduler`, the next `advance`, even by `.zero`).
    /// The far end of time never returns (until cancelled).
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try await ClockSleep.sleep(
            on: engine, until: deadline.ticks,
            leeway: tolerance.map(DeadlineArithmetic.delayNanoseconds) ?? 0)
    }
}

extension TimerClock.Instant {
    /// Adds a duration (saturating).
    public static func + (lhs: Self, rhs: Duration) -> Self { lhs.advanced(by: rhs) }
    /// Subtracts a duration (saturating).
    public static func - (lhs: Self, rhs: Duration) -> Self {
        // Negating `rhs` could overflow (`Int128.min` attoseconds); its
        // nanoseconds are clamped first, and their negation saturates.
        let nanoseconds = DeadlineArithmetic.nanoseconds(rhs)
        let negated = nanoseconds == Int64.min ? Int64.max : -nanoseconds
        return Self(ticks: DeadlineArithmetic.adding(negated, to: lhs.ticks))
    }
    /// The time from `rhs` to `lhs`.
    public static func - (lhs: Self, rhs: Self) -> Duration { rhs.duration(to: lhs) }
}

extension TimerScheduler {
    /// This scheduler's `Clock`: sleeps on it are entries of this scheduler's
    /// engine, so under a manual scheduler `advance(by:)` ends them.
    public var clock: TimerClock { TimerClock(engine: engine) }
}
