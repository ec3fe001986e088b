#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A pthread mutex with one condition variable whose timed wait uses the monotonic
/// clock (the same clock as ``MonotonicClock``).
///
/// `Synchronization.Mutex` has no condition variable, and the scheduler thread must
/// sleep until a deadline *and* be woken early, so the engine uses this instead.
///
/// `@unchecked Sendable` invariant: the two pthread objects live in memory allocated
/// once in `init` and freed once in `deinit`, never moved; every access goes through
/// the pthread calls, which are thread-safe by contract.
package final class ConditionLock: @unchecked Sendable {
    /// The mutex (a shard of an engine locks it directly, see `TimerEngine.Shard`).
    let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    /// Creates an unlocked lock.
    ///
    /// The mutex gets a cache line (two, against adjacent-line prefetching) of its
    /// own, so that the locks of an engine's shards, made one after another, never
    /// share one (false sharing would make threads on different shards contend).
    package init() {
        mutex = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 128)
            .bindMemory(to: pthread_mutex_t.self, capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var error = pthread_mutex_init(mutex, nil)
        precondition(error == 0, "pthread_mutex_init failed: \(error)")
        #if canImport(Darwin)
        error = pthread_cond_init(condition, nil)
        #else
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        error = pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
        #endif
        precondition(error == 0, "pthread_cond_init failed: \(error)")
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deinitialize(count: 1)
        condition.deallocate()
        mutex.deinitialize(count: 1)
        UnsafeMutableRawPointer(mutex).deallocate()
    }

    /// Locks the mutex.
    @inline(__always)
    package func lock() { pthread_mutex_lock(mutex) }

    /// Unlocks the mutex.
    @inline(__always)
    package func unlock() { pthread_mutex_unlock(mutex) }

    /// Runs `body` with the mutex held.
    @inline(__always)
    package func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Wakes one waiter. Cheap (no system call) when nobody waits.
    @inline(__always)
    package func signal() { pthread_cond_signal(condition) }

    /// Wakes every waiter.
    package func broadcast() { pthread_cond_broadcast(condition) }

    /// Waits until signalled; the mutex must be held. May wake spuriously.
    package func wait() { pthread_cond_wait(condition, mutex) }

    /// Waits until signalled or until the monotonic clock reaches `deadline`
    /// (nanoseconds, as ``MonotonicClock/nanoseconds()``); the mutex must be held.
    /// May wake spuriously.
    package func wait(untilMonotonic deadline: Int64) {
        // Seconds are clamped to what `time_t` holds: on 32-bit platforms (watchOS
        // arm64_32, 32-bit Linux) a deadline beyond about 68 years would otherwise
        // trap in the conversion. A wait that ends early is harmless: callers loop.
        #if canImport(Darwin)
        let remaining = max(0, deadline &- MonotonicClock.nanoseconds())
        var relative = timespec(
            tv_sec: time_t(clamping: remaining / 1_000_000_000), tv_nsec: Int(remaining % 1_000_000_000))
        pthread_cond_timedwait_relative_np(condition, mutex, &relative)
        #else
        var absolute = timespec(
            tv_sec: time_t(clamping: deadline / 1_000_000_000),
            tv_nsec: Int(deadline % 1_000_000_000)
        )
        pthread_cond_timedwait(condition, mutex, &absolute)
        #endif
    }
}
