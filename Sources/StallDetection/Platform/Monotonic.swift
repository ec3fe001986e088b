import SafeTimers

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Monotonic nanoseconds (`CLOCK_MONOTONIC` on Linux, `CLOCK_UPTIME_RAW` on Apple
/// platforms): the clock of every time the detector measures. It does not advance
/// while the machine sleeps.
enum Monotonic {
    /// SafeTimers' clock (`MonotonicClock`), so that the detector's times and
    /// its timers' deadlines are on one clock.
    @inline(__always)
    static func now() -> Int64 { MonotonicClock.nanoseconds() }

    /// A duration in nanoseconds, saturating, whatever its magnitude: the one
    /// conversion the whole package uses (`DeadlineArithmetic` in SafeTimers).
    static func nanoseconds(_ duration: Duration) -> Int64 {
        DeadlineArithmetic.nanoseconds(duration)
    }
}
