#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The clock every `SystemTimerScheduler` reads: monotonic, in nanoseconds.
///
/// On Linux this is `CLOCK_MONOTONIC`; on Apple platforms `CLOCK_UPTIME_RAW`.
/// Neither advances while the machine sleeps, and neither jumps when the wall clock
/// is changed. A deadline is therefore "so much *running* time from now": a
/// watchdog armed for 2 s just before the machine sleeps fires 2 s of awake time
/// later, not at once on wake-up. Reading it costs about 25 ns here (vDSO).
package enum MonotonicClock {
    /// Nanoseconds since an arbitrary, fixed point in the past.
    @inline(__always)
    package static func nanoseconds() -> Int64 {
        #if canImport(Darwin)
        return Int64(truncatingIfNeeded: clock_gettime_nsec_np(CLOCK_UPTIME_RAW))
        #else
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
        #endif
    }
}
