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
/// later, not at once on wake-up. On Linux a read is a vDSO call, no system call.
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

    /// The resolution of ``coarseNanoseconds()`` in nanoseconds (0 where there is
    /// no coarse clock and ``coarseNanoseconds()`` reads the precise one).
    ///
    /// `clock_getres(CLOCK_MONOTONIC_COARSE)`: 1–10 ms on Linux (the kernel's
    /// tick, `CONFIG_HZ`); -1 if the call fails.
    package static let coarseResolution: Int64 = {
        #if os(Linux)
        var spec = timespec()
        guard clock_getres(CLOCK_MONOTONIC_COARSE, &spec) == 0 else { return -1 }
        return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
        #else
        return 0
        #endif
    }()

    /// The same clock as ``nanoseconds()``, read cheaply and coarsely: on Linux
    /// `CLOCK_MONOTONIC_COARSE`, which reads a value the kernel stored instead of
    /// the hardware counter. Elsewhere the precise clock.
    ///
    /// A coarse reading is the time of the kernel's last timekeeping update, so it
    /// is never ahead of ``nanoseconds()``, but it is behind by *more* than
    /// ``coarseResolution``: by the time since that update, which is up to a
    /// whole tick when ticks come on time, plus however late the update itself
    /// came (a tick handled late, or skipped by a tickless idle CPU, on a busy or
    /// virtual machine): nearly two resolutions on a busy virtual machine.
    /// Nothing in the kernel bounds the lag, so a caller adds a margin:
    /// `WatchdogSlot` adds three resolutions; a reading could be early only if
    /// the timekeeping update came more than two whole ticks late.
    @inline(__always)
    package static func coarseNanoseconds() -> Int64 {
        #if os(Linux)
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC_COARSE, &spec)
        return Int64(spec.tv_sec) &* 1_000_000_000 &+ Int64(spec.tv_nsec)
        #else
        return nanoseconds()
        #endif
    }
}
