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
///
/// Kept in 15 bytes, since every pending primitive carries one: tags and the
/// count of ended invocations are 32-bit and wrap (a revoked delivery whose tag
/// comes round again after 2^32 deliveries would at most begin the one that is
/// queued then, which the gate admits anyway; tickets compare counts by wrapping
/// difference), and thread ids are ``ThreadIdentity/current()`` numbers, which
/// fit in 32 bits.
struct InvocationGate: Sendable, Hashable {
    /// The thread running the handler; 0 when none runs.
    private var runningThread: UInt32 = 0
    /// The last tag handed out.
    private var lastTag: UInt32 = 0
    /// Invocations ended, ever (wrapping).
    private var endedCount: UInt32 = 0
    /// Threads waiting in a cancel for the running invocation to end.
    private var waiterCount: UInt16 = 0
    /// Whether `lastTag` is queued.
    private var isQueued = false

    /// A gate with nothing in flight.
    init() {}

    /// Tests: a gate whose tag and ended counts start at `lastTag` and `ended`
    /// (near their wrap, say).
    init(lastTag: UInt32, ended: UInt32) {
        self.lastTag = lastTag
        self.endedCount = ended
    }

    /// The tag that may begin, if an invocation is queued.
    var queued: UInt64? { isQueued ? UInt64(lastTag) : nil }

    /// The thread running the handler; 0 when none runs.
    var runner: UInt { UInt(runningThread) }

    /// Invocations ended, ever (wrapping at 2^32).
    var ended: UInt64 { UInt64(endedCount) }

    /// Threads waiting in a cancel for the running invocation to end.
    var waiters: Int { Int(waiterCount) }

    /// Whether nothing is in flight: no invocation queued, none running.
    var isIdle: Bool { !isQueued && runningThread == 0 }

    /// Whether a handler invocation is running.
    var isRunning: Bool { runningThread != 0 }

    /// Queues a new invocation and returns its tag, or nil when one is already in
    /// flight (the caller then owes it, by its own rules).
    mutating func deliver() -> UInt64? {
        guard isIdle else { return nil }
        lastTag &+= 1
        isQueued = true
        return UInt64(lastTag)
    }

    /// Makes the queued invocation, if any, never begin.
    mutating func revoke() {
        isQueued = false
    }

    /// The executor reached `tag` on `thread`: returns whether it may run.
    /// `thread` must be below 2^32 and not 0 (``ThreadIdentity/current()`` is).
    mutating func begin(tag: UInt64, thread: UInt) -> Bool {
        guard isQueued, UInt64(lastTag) == tag, runningThread == 0 else { return false }
        isQueued = false
        runningThread = UInt32(truncatingIfNeeded: thread)
        return true
    }

    /// The running invocation returned. Returns whether a cancel waits for it, in
    /// which case the caller wakes the waiters (``InvocationParking/wakeAll()``)
    /// once it has released its lock.
    mutating func end() -> Bool {
        runningThread = 0
        endedCount &+= 1
        return waiterCount > 0
    }

    /// If the handler runs on a thread other than `thread`, registers a waiter and
    /// returns the ticket it waits for; nil when there is nothing to wait for.
    /// (Also nil for a 65,536th thread waiting at once for one handler: it
    /// returns without waiting rather than overflow the count.)
    mutating func waitTicket(thread: UInt) -> WaitTicket? {
        guard runningThread != 0, UInt(runningThread) != thread, waiterCount < UInt16.max else { return nil }
        waiterCount += 1
        return WaitTicket(ended: endedCount &+ 1, runner: UInt(runningThread))
    }

    /// Whether the invocation a ticket waits for has ended.
    func hasPassed(_ ticket: WaitTicket) -> Bool { Int32(bitPattern: endedCount &- ticket.ended) >= 0 }

    /// A waiter stopped waiting.
    mutating func leave() { waiterCount -= 1 }
}

/// What a cancel waits for: the invocation that runs on `runner` to end (the
/// gate's count of ended invocations to reach `ended`, wrapping).
struct WaitTicket: Sendable, Hashable {
    let ended: UInt32
    let runner: UInt
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
/// It also keeps who waits for whom, to refuse the one wait that can never
/// end: handler A (on thread 1) cancels timer B while B's handler (on thread 2)
/// cancels timer A. Each would wait for the other's handler to return. Before a
/// thread waits for the handler running on `runner`, the chain of waits that
/// starts at `runner` is followed; if it leads back to the waiting thread, the
/// wait is refused and the cancel returns at once (the cancelled handler still
/// never begins again; the one running finishes on its own). Every other wait
/// goes ahead, so the barrier holds wherever it can hold at all.
///
/// Lock order: a waiter holds the parking lock while it briefly takes a
/// primitive's lock to check; a handler's thread releases the primitive's lock
/// before it takes the parking lock. So the two never wait on each other.
enum InvocationParking {
    private static let lock = ConditionLock()
    /// Thread → the thread whose handler it waits for (parking lock held).
    nonisolated(unsafe) private static var waitsFor: [UInt: UInt] = [:]

    /// Blocks until `isDone` returns true, unless waiting for the handler that
    /// runs on `runner` would close a cycle of waits (returns false then).
    /// `isDone` is evaluated with the parking lock held, so a wake-up between
    /// the check and the wait cannot be lost.
    static func wait(forHandlerOn runner: UInt, until isDone: () -> Bool) -> Bool {
        let me = ThreadIdentity.current()
        lock.lock()
        var next: UInt? = runner
        var steps = 0
        while let thread = next, steps <= waitsFor.count {
            if thread == me {
                lock.unlock()
                return false
            }
            next = waitsFor[thread]
            steps += 1
        }
        waitsFor[me] = runner
        while !isDone() { lock.wait() }
        waitsFor[me] = nil
        lock.unlock()
        return true
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
    /// waits for has ended (unless that would close a cycle of waits, see
    /// ``InvocationParking``), then unregisters the waiter. Call it without
    /// holding the lock, after the input that returned the ticket.
    func wait(for ticket: WaitTicket) {
        _ = InvocationParking.wait(forHandlerOn: ticket.runner) { withLock { $0.gate.hasPassed(ticket) } }
        withLock { $0.gate.leave() }
    }
}
