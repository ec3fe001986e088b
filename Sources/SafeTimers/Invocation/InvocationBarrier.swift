import Dispatch
import Synchronization

/// The record, kept inside a primitive's locked state, of the user handler that is
/// running right now; it is what makes `cancel()` a barrier.
///
/// Every primitive follows one discipline:
/// 1. Its fire path, on the handler's queue, re-checks the primitive's state under
///    the primitive's lock and, if the handler may still run, calls ``begin()``
///    under that same lock before releasing it and calling the handler.
/// 2. `cancel()` changes the state under the lock (so no later fire path passes the
///    check) and, if a handler had already begun on *another* thread, waits until
///    it has returned (``registerWaiter()`` then ``Mutex/waitForInvocation(_:)``).
/// 3. After the handler returns, the fire path calls ``end()`` under the lock and,
///    if someone waits, wakes the waiters (``InvocationParking/wakeAll()``).
///
/// So once `cancel()` has returned, no handler is running (except the one that
/// called `cancel()` itself) and none will begin. A `cancel()` from inside the
/// handler never waits, so it cannot deadlock on itself.
struct InvocationBarrier: Sendable {
    /// The thread running the handler, or 0 when none is.
    private(set) var thread: UInt = 0
    /// Invocations begun and ended, ever.
    private(set) var begun: UInt64 = 0
    private(set) var ended: UInt64 = 0
    /// Threads waiting in `cancel()` for the running invocation to end.
    private var waiters = 0

    /// Whether a handler invocation is in progress.
    var isRunning: Bool { thread != 0 }

    /// Whether the current thread is the one running the handler (a call from
    /// inside the handler).
    var isCurrentThreadRunning: Bool { thread != 0 && thread == ThreadIdentity.current() }

    /// Marks an invocation as begun on the current thread (primitive lock held).
    mutating func begin() {
        thread = ThreadIdentity.current()
        begun &+= 1
    }

    /// Marks the invocation as ended (primitive lock held); returns whether any
    /// thread waits for it, in which case the caller must call
    /// ``InvocationParking/wakeAll()`` after releasing the lock.
    mutating func end() -> Bool {
        thread = 0
        ended &+= 1
        return waiters > 0
    }

    /// If an invocation is running on another thread, registers the caller as a
    /// waiter and returns the count of begun invocations it must see ended.
    mutating func registerWaiter() -> UInt64? {
        guard thread != 0, thread != ThreadIdentity.current() else { return nil }
        waiters += 1
        return begun
    }

    mutating func unregisterWaiter() {
        waiters -= 1
    }
}

/// Any primitive state that carries an ``InvocationBarrier``.
protocol InvocationBarrierHolder: ~Copyable {
    var barrier: InvocationBarrier { get set }
}

/// One process-wide condition variable on which cancelling threads wait for a
/// running handler to return. Waiting is rare (a cancel racing a handler on
/// another thread), so one shared condition costs nothing per primitive.
///
/// Lock order: a waiter holds the parking lock while it briefly takes a
/// primitive's lock to check; a handler's thread releases the primitive's lock
/// before it takes the parking lock. So the two never wait on each other.
enum InvocationParking {
    private static let lock = ConditionLock()

    /// Blocks until `isDone` returns true; `isDone` is evaluated with the parking
    /// lock held, so a wake-up between the check and the wait cannot be lost.
    static func wait(until isDone: () -> Bool) {
        lock.lock()
        while !isDone() { lock.wait() }
        lock.unlock()
    }

    /// Wakes every waiting thread so that each re-checks its condition.
    static func wakeAll() {
        lock.lock()
        lock.broadcast()
        lock.unlock()
    }
}

extension StateLock where Value: InvocationBarrierHolder {
    /// The cancel half of the barrier discipline: `take` (lock held) moves the state
    /// on and returns whether it prevented a run, the handler it took out
    /// (released here, outside the lock, before this returns) and whether an
    /// invocation may be running; if one runs on another thread and
    /// `waitingForRun`, this waits until it returned. Returns what `take` said of
    /// prevention.
    ///
    /// Handlers travel through captured variables rather than generic results:
    /// a closure returned through a generic type is re-wrapped in a heap-allocated
    /// thunk, which measured two allocations per cancel.
    @inline(__always)
    func cancelOnce(
        waitingForRun: Bool = true,
        _ take: (inout Value) -> (prevented: Bool, released: (@Sendable () -> Void)?, mayBeRunning: Bool)
    ) -> Bool {
        var released: (@Sendable () -> Void)? = nil
        var waitFor: UInt64? = nil
        let prevented = withLock { value -> Bool in
            let outcome = take(&value)
            released = outcome.released
            if outcome.mayBeRunning && waitingForRun { waitFor = value.barrier.registerWaiter() }
            return outcome.prevented
        }
        // The captures go here, outside the lock. (Not `withExtendedLifetime`:
        // being generic, it would re-wrap the closure in an allocated thunk.)
        if case .some = released { released = nil }
        if let waitFor { waitForInvocation(waitFor) }
        return prevented
    }

    /// Runs a one-shot handler under the barrier discipline: `claim` (lock held)
    /// moves the state on and hands the handler over, or returns nil when it must
    /// not run; the handler then runs outside the lock and is released before the
    /// invocation counts as ended; `finish` (lock held) records the end.
    func runOnce(
        claim: (inout Value) -> (@Sendable () -> Void)?,
        finish: (inout Value) -> Void = { _ in }
    ) {
        var handler: (@Sendable () -> Void)? = nil
        let claimed = withLock { value -> Bool in
            guard let claimedHandler = claim(&value) else { return false }
            value.barrier.begin()
            handler = claimedHandler
            return true
        }
        guard claimed else { return }
        handler?()
        handler = nil  // release the captures before the run counts as ended
        let wake = withLock { value in
            finish(&value)
            return value.barrier.end()
        }
        if wake { InvocationParking.wakeAll() }
    }

    /// Waits until the invocation counted as `begun` has ended, then unregisters
    /// the waiter that ``InvocationBarrier/registerWaiter()`` registered.
    /// Call it without holding the lock.
    func waitForInvocation(_ begun: UInt64) {
        InvocationParking.wait { withLock { $0.barrier.ended >= begun } }
        withLock { $0.barrier.unregisterWaiter() }
    }
}
