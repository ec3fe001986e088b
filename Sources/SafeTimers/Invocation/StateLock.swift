import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A small lock beside the value it protects: one 32-bit word, no allocation.
///
/// Every SafeTimers primitive keeps its state in one of these. It replaces
/// `Synchronization.Mutex` for two measured reasons (release build, this 2-core
/// Linux machine):
/// - **Speed.** `Mutex` reads the kernel thread id on every lock *and* unlock
///   (it stores the owner for priority inheritance): 23 ns an uncontended
///   lock/unlock pair, against 10 ns here, which is a compare-and-swap to lock and
///   an exchange to unlock.
/// - **ThreadSanitizer.** `Mutex`'s contended path lives in the standard library,
///   which is not built with TSan, so TSan saw no happens-before edge between two
///   critical sections and reported every access to the protected value as a race
///   (reproduced with a four-thread counter). Here every atomic operation is
///   compiled into SafeTimers, where TSan instruments it.
///
/// The lock word is 0 (unlocked), 1 (locked) or 2 (locked, and a thread may be
/// parked waiting for it), as in Drepper's "Futexes are tricky". A thread that
/// finds the lock taken retries briefly, then parks on one of
/// ``LockParking``'s condition variables (chosen by the lock's address); an
/// unlock that finds 2 wakes the threads parked there. Critical sections in
/// SafeTimers are a few dozen instructions and never call user code, so parking
/// is rare.
///
/// `@unchecked Sendable` invariant: the value is reachable only through
/// ``withLock(_:)``, which holds the lock for the whole access, and values move
/// in and out with `sending`, as with `Mutex`.
@_spi(SafeTimersInternal)
public struct StateLock<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    private let word = Atomic<UInt32>(0)
    private let cell: _Cell<Value>

    /// Creates a lock protecting `initialValue`.
    public init(_ initialValue: consuming sending Value) {
        cell = _Cell(initialValue)
    }

    /// Runs `body` with exclusive access to the value, as `Mutex.withLock`.
    @inline(__always)
    public borrowing func withLock<Result: ~Copyable, Failure: Error>(
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result {
        lock()
        defer { unlock() }
        return try body(&cell._address.pointee)
    }

    @inline(__always)
    private borrowing func lock() {
        if _fastPath(word.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged) { return }
        lockContended()
    }

    @inline(__always)
    private borrowing func unlock() {
        if _slowPath(word.exchange(0, ordering: .releasing) == 2) {
            LockParking.wakeAll(for: UnsafeRawPointer(cell._address))
        }
    }

    @inline(never)
    private borrowing func lockContended() {
        // A short spin first: the holder is usually a few instructions from the end.
        for _ in 0..<100 {
            if word.load(ordering: .relaxed) == 0,
                word.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged
            {
                return
            }
        }
        // Mark the lock contended; whoever holds it wakes the parked threads.
        let key = UnsafeRawPointer(cell._address)
        LockParking.park(for: key) { word.exchange(2, ordering: .acquiring) == 0 }
    }
}

/// Condition variables on which threads wait for a contended ``StateLock``: a
/// fixed set shared by every lock in the process and chosen by address, so a lock
/// costs one word.
enum LockParking {
    private static let stripes: [ConditionLock] = (0..<32).map { _ in ConditionLock() }

    @inline(__always)
    private static func stripe(for key: UnsafeRawPointer) -> ConditionLock {
        let address = UInt(bitPattern: key)
        return stripes[Int(truncatingIfNeeded: (address >> 4) ^ (address >> 9)) & (stripes.count - 1)]
    }

    /// Waits until `acquired` returns true. `acquired` runs with the stripe held;
    /// an unlock that needs to wake us takes the same stripe, so its wake-up cannot
    /// fall between our check and our wait.
    static func park(for key: UnsafeRawPointer, until acquired: () -> Bool) {
        let stripe = stripe(for: key)
        stripe.lock()
        while !acquired() { stripe.wait() }
        stripe.unlock()
    }

    /// Wakes every thread parked on `key`'s stripe; each re-checks its lock.
    static func wakeAll(for key: UnsafeRawPointer) {
        let stripe = stripe(for: key)
        stripe.lock()
        stripe.broadcast()
        stripe.unlock()
    }
}

/// Whether this process runs under ThreadSanitizer, whose entry points are then
/// present; tests scale their iteration counts by it.
enum ThreadSanitizerAnnotations {
    static let isActive: Bool = {
        dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_acquire") != nil
    }()
}
