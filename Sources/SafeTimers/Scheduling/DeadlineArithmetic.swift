/// Saturating conversions between `Duration` and the engine's nanosecond ticks.
///
/// Nothing here traps. A delay too long to represent means "never"; a negative or
/// zero delay means "as soon as possible". This is the single place where time
/// arithmetic happens, so every primitive, and every module of the package
/// (`StallDetection`, `StallDetectionReporting`), inherits the same outcomes.
///
/// `Duration` holds 128 bits of attoseconds: about ±5.4 × 10^21 years, far more
/// than `Duration.components` can return (it traps once the seconds do not fit
/// in `Int64`, for example for `.seconds(1e20)`). So every conversion here first
/// compares with the representable range, which never traps, and only then splits
/// the value.
package enum DeadlineArithmetic {
    /// The deadline value that means "never": an entry armed with it stays pending
    /// until it is cancelled and costs the scheduler thread no wake-up.
    package static let never = Int64.max

    /// The largest and smallest durations that fit in `Int64` nanoseconds.
    private static let largest = Duration.nanoseconds(Int64.max)
    private static let smallest = Duration.nanoseconds(Int64.min)

    /// `duration` in whole nanoseconds, clamped to `Int64.min ... Int64.max`.
    ///
    /// Sub-nanosecond parts are truncated toward zero. Any magnitude is accepted.
    @inline(__always)
    package static func nanoseconds(_ duration: Duration) -> Int64 {
        // The common case, 0 to 2^64 attoseconds (about 18 s), is one 64-bit
        // division; `components` would divide 128 bits (about 190 instructions).
        if duration._high == 0 { return Int64(truncatingIfNeeded: duration._low / 1_000_000_000) }
        return nanosecondsSlowPath(duration)
    }

    private static func nanosecondsSlowPath(_ duration: Duration) -> Int64 {
        if duration >= largest { return Int64.max }
        if duration <= smallest { return Int64.min }
        // |duration| < 2^63 ns ≈ 292 years: the components fit, and so does the sum.
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// `duration` in seconds as a `Double` (±infinity never occurs: the result is
    /// clamped to what `Int64` nanoseconds can hold).
    package static func seconds(_ duration: Duration) -> Double {
        Double(nanoseconds(duration)) / 1e9
    }

    /// `duration` in milliseconds as a `Double`, clamped like ``seconds(_:)``.
    package static func milliseconds(_ duration: Duration) -> Double {
        Double(nanoseconds(duration)) / 1e6
    }

    /// A delay in nanoseconds, with everything negative clamped to zero.
    package static func delayNanoseconds(_ delay: Duration) -> Int64 {
        max(0, nanoseconds(delay))
    }

    /// `now + delay`, saturating at ``never``; a negative delay counts as zero.
    package static func deadline(now: Int64, after delay: Duration) -> Int64 {
        adding(delayNanoseconds(delay), to: now)
    }

    /// `base + nanoseconds`, saturating at ``never`` (and never below `Int64.min`).
    package static func adding(_ nanoseconds: Int64, to base: Int64) -> Int64 {
        let (sum, overflow) = base.addingReportingOverflow(nanoseconds)
        if overflow { return nanoseconds > 0 ? never : Int64.min }
        return sum
    }

    /// `count × step`, saturating at `Int64.max` (both non-negative).
    package static func multiplying(_ step: Int64, by count: Int64) -> Int64 {
        let (product, overflow) = step.multipliedReportingOverflow(by: count)
        return overflow ? Int64.max : product
    }
}
