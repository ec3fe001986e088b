/// Saturating conversions between `Duration` and the engine's nanosecond ticks.
///
/// Nothing here traps. A delay too long to represent means "never"; a negative or
/// zero delay means "as soon as possible". This is the single place where time
/// arithmetic happens, so every primitive inherits the same outcomes.
enum DeadlineArithmetic {
    /// The deadline value that means "never": an entry armed with it stays pending
    /// until it is cancelled and costs the scheduler thread no wake-up.
    static let never = Int64.max

    /// `duration` in whole nanoseconds, clamped to `Int64.min ... Int64.max`.
    ///
    /// Sub-nanosecond parts are truncated toward zero.
    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? Int64.min : Int64.max }
        let (sum, overflow2) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflow2 { return attoseconds < 0 ? Int64.min : Int64.max }
        return sum
    }

    /// A delay in nanoseconds, with everything negative clamped to zero.
    static func delayNanoseconds(_ delay: Duration) -> Int64 {
        max(0, nanoseconds(delay))
    }

    /// `now + delay`, saturating at ``never``; a negative delay counts as zero.
    static func deadline(now: Int64, after delay: Duration) -> Int64 {
        adding(delayNanoseconds(delay), to: now)
    }

    /// `base + nanoseconds`, saturating at ``never`` (and never below `Int64.min`).
    static func adding(_ nanoseconds: Int64, to base: Int64) -> Int64 {
        let (sum, overflow) = base.addingReportingOverflow(nanoseconds)
        if overflow { return nanoseconds > 0 ? never : Int64.min }
        return sum
    }
}
