import SafeTimers

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A value behind a `pthread_mutex_t`: StallDetection's one lock. It is a pthread
/// mutex (not `Synchronization.Mutex`) so that ThreadSanitizer sees every
/// acquisition, and it belongs to this module so that it does not depend on
/// SafeTimers' internals.
///
/// `@unchecked Sendable` invariant: `value` is read and written only inside
/// ``withLock(_:)``, between `pthread_mutex_lock` and `pthread_mutex_unlock` of
/// `mutex`; the mutex is initialised in `init` and destroyed in `deinit`, when no
/// other reference exists.
///
/// `Value` is never empty (`()`): ThreadSanitizer takes an access to an empty
/// value for an access to the field at the same address, the mutex pointer, and
/// reports a race between two critical sections. A lock that guards no data of
/// its own holds a count of its uses instead.
final class Locked<Value>: @unchecked Sendable {
    private var value: Value
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    init(_ value: Value) {
        assert(MemoryLayout<Value>.size > 0, "Locked<\(Value.self)>: an empty value aliases the mutex pointer")
        self.value = value
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held. `body` must not call user code, block, or
    /// release an object whose `deinit` waits for another thread.
    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
