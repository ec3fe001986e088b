/// The one invocation discipline every SafeTimers primitive follows, as a pure
/// value kept inside each primitive's state machine.
///
/// A primitive's handler is *in flight* from the moment an invocation is handed
/// to its executor (*queued*) until the handler returns (*running*, then ended).
/// The gate admits at most one invocation in flight at any time:
///
/// | input | allowed when | effect |
/// |---|---|---|
/// | ``deliver()`` | nothing in flight (``isIdle``) | a new tag is queued; the caller hands it to the executor |
/// | ``revoke()`` | always | the queued tag, if any, will never begin (its delivery finds nothing to do) |
/// | ``begin(tag:thread:)`` | `tag` is the queued one and nothing runs | the tag runs on `thread` |
/// | ``end()`` | a tag runs | nothing in flight; returns whether a canceller waits |
/// | ``waitTicket(thread:)`` | a tag runs on *another* thread | the caller must wait until ``hasPassed(_:)`` |
///
/// What this buys every primitive, whatever its state machine does around it:
/// - **No overlap.** A second invocation can only be queued once the first has
///   ended, and a queued one begins only if it is still the queued one. State
///   changes (suspend, resume, cancel, restart) revoke a queued tag but never
///   forget a *running* one, so nothing can slip in beside it.
/// - **Cancel is a barrier.** A cancel revokes the queued tag (it will not begin)
///   and, if the handler runs on another thread, takes a ticket and waits for that
///   invocation to end. A cancel from inside the handler gets no ticket, so it
///   cannot wait for itself.
///
/// Thread ids are plain values (``ThreadIdentity/current()`` in production,
/// made-up ones in the interleaving explorer), so the gate is deterministic and
/// can be driven through every interleaving.
struct InvocationGate: Sendable, Hashable {
    /// The tag that may begin, if an invocation is queued.
    private(set) var queued: UInt64?
    /// The last tag handed out.
    private var lastTag: UInt64 = 0
    /// The thread running the handler; 0 when none runs.
    private(set) var runner: UInt = 0
    /// Invocations ended, ever.
    private(set) var ended: UInt64 = 0
    /// Threads waiting in a cancel for the running invocation to end.
    private(set) var waiters = 0

    /// Whether nothing is in flight: no invocation queued, none running.
    var isIdle: Bool { queued == nil && runner == 0 }

    /// Whether a handler invocation is running.
    var isRunning: Bool { runner != 0 }

    /// Queues a new invocation and returns its tag, or nil when one is already in
    /// flight (the caller then owes it, by its own rules).
    mutating func deliver() -> UInt64? {
        guard isIdle else { return nil }
        lastTag &+= 1
        queued = lastTag
        return lastTag
    }

    /// Makes the queued invocation, if any, never begin.
    mutating func revoke() {
        queued = nil
    }

    /// The executor reached `tag` on `thread`: returns whether it may run.
    mutating func begin(tag: UInt64, thread: UInt) -> Bool {
        guard queued == tag, runner == 0 else { return false }
        queued = nil
        runner = thread
        return true
    }

    /// The running invocation returned. Returns whether a cancel waits for it, in
    /// which case the caller wakes the waiters (``InvocationParking/wakeAll()``)
    /// once it has released its lock.
    mutating func end() -> Bool {
        runner = 0
        ended &+= 1
        return waiters > 0
    }

    /// If the handler runs on a thread other than `thread`, registers a waiter and
    /// returns the ticket it waits for; nil when there is nothing to wait for.
    mutating func waitTicket(thread: UInt) -> UInt64? {
        guard runner != 0, runner != thread else { return nil }
        waiters += 1
        return ended &+ 1
    }

    /// Whether the invocation a ticket waits for has ended.
    func hasPassed(_ ticket: UInt64) -> Bool { ended >= ticket }

    /// A waiter stopped waiting.
    mutating func leave() { waiters -= 1 }
}

/// What a primitive's state machine asks of the engine after an input.
enum TimerCommand: Sendable, Hashable {
    /// Leave the engine entry as it is.
    case keep
    /// Arm (or move) the entry to this deadline, in engine ticks.
    case arm(Int64)
    /// Take the entry out of the engine.
    case disarm
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

/// A state machine that keeps an ``InvocationGate``.
protocol GatedStateMachine {
    var gate: InvocationGate { get set }
}

extension StateLock where Value: GatedStateMachine {
    /// The waiting half of the barrier: blocks until the invocation `ticket`
    /// waits for has ended, then unregisters the waiter. Call it without holding
    /// the lock, after the input that returned the ticket.
    func wait(for ticket: UInt64) {
        InvocationParking.wait { withLock { $0.gate.hasPassed(ticket) } }
        withLock { $0.gate.leave() }
    }
}
