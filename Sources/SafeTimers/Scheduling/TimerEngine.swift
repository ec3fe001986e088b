#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The machinery behind every scheduler: a timing wheel of armed entries, a
/// lock, and either a real clock with one tickless thread
/// (``SystemTimerScheduler``) or a virtual clock advanced by hand
/// (`ManualTimerScheduler` in `SafeTimersTesting`).
///
/// Both kinds share the wheel, the ordering rules (deadline, then arming order)
/// and the arm/disarm paths, so what a test proves under virtual time is the code
/// that runs in production.
///
/// Time is kept as `Int64` nanoseconds since the engine was created ("ticks").
///
/// `@unchecked Sendable` invariant: every mutable stored value lives in the
/// `State` that `state` points to, which is read and written only while `lock` is
/// held; the remaining properties are immutable after `init`. (The state sits
/// behind a pointer allocated once, rather than in a stored `var`, so that the
/// hot paths pay no dynamic exclusivity check.)
@_spi(SchedulerImplementation)
public final class TimerEngine: @unchecked Sendable {
    /// Mutable engine state; touched only with `lock` held.
    private struct State: ~Copyable {
        var wheel = TimerWheel()
        var lastSequence: UInt64 = 0
        /// Virtual clock (manual engines only).
        var virtualNow: Int64 = 0
        /// What the scheduler thread waits for: `Int64.min` while it is awake (it
        /// will look at the wheel again before sleeping, so nobody needs to wake
        /// it), otherwise the time it sleeps until (`never` when untimed).
        var sleepingUntil = Int64.min
        var threadStarted = false
        var schedulerThreadID: Int32 = 0
        var shuttingDown = false
        /// The scheduler object is gone: a real engine's thread ends once nothing
        /// is armed (what is armed still fires); a manual engine is shut down.
        var retired = false
        /// Manual engines: handler deliveries waiting for the next advance, in
        /// order, each with a sequence number from the arming sequence, so that
        /// an entry armed earlier for the same instant runs first.
        var deliveries: [(sequence: UInt64, body: @Sendable () -> Void)] = []
        /// The advancing thread and the sequence of the entry it is firing: a
        /// delivery that firing makes is ordered by the entry's sequence.
        var firing: (thread: UInt, sequence: UInt64)?
        var deliveryHead = 0
        /// Scheduler-thread wake-ups, counted for tests and benchmarks.
        var wakeUps = 0
        /// Manual engines: tasks suspended in a sleep on the engine's clock, and
        /// the tests waiting for that count to reach theirs.
        var sleepers = 0
        var sleeperWaiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let lock = ConditionLock()
    private let state: UnsafeMutablePointer<State>
    /// The monotonic clock's reading at tick 0 (0 for a manual engine).
    let origin: Int64
    /// `true` for a manual engine: entries fire synchronously inside `advance(by:)`
    /// and primitives queue their handlers on the engine (``enqueueDelivery(_:)``),
    /// which the advancing thread runs, instead of on their queue.
    let isVirtual: Bool

    /// The most handler deliveries one advance runs at one instant before it stops
    /// there (see ``advance(toTicks:)``): far more than any catch-up needs, few
    /// enough that handlers that keep re-triggering each other cannot hang a test.
    static let deliveryLimitPerInstant = 100_000

    /// The most entries the scheduler thread takes out of the wheel per lock hold,
    /// so arming threads never wait behind a long batch.
    private static let batchLimit = 256

    /// Creates an engine. A real-time engine starts its thread at the first arm.
    public init(virtual: Bool) {
        isVirtual = virtual
        origin = virtual ? 0 : MonotonicClock.nanoseconds()
        state = .allocate(capacity: 1)
        state.initialize(to: State())
    }

    deinit {
        // A real engine ends once its scheduler is gone, nothing is armed and its
        // thread has ended; a manual one once nothing refers to it.
        let entries = state.pointee.wheel.removeAll()
        state.deinitialize(count: 1)
        state.deallocate()
        _ = entries
    }

    /// The current time in ticks.
    @inline(__always)
    var nowTicks: Int64 {
        if isVirtual { return lock.withLock { state.pointee.virtualNow } }
        return MonotonicClock.nanoseconds() &- origin
    }

    /// The current time as a `Duration` since the engine was created.
    public var now: Duration { .nanoseconds(nowTicks) }

    /// How many entries are armed.
    public var pendingCount: Int { lock.withLock { state.pointee.wheel.count } }

    /// The Linux thread id of the scheduler thread, or 0 before it started.
    public var schedulerThreadID: Int32 { lock.withLock { state.pointee.schedulerThreadID } }

    /// How often the scheduler thread woke up (from a timed wait or a signal).
    public var wakeUpCount: Int { lock.withLock { state.pointee.wakeUps } }

    /// Arms `entry` at `deadline` (ticks), moving it if it is armed already.
    ///
    /// Returns the arming's sequence number: ``TimerEntry/timerFired(deadline:sequence:engine:)``
    /// receives it back, so an entry can ignore a firing that belongs to an arming
    /// it has since replaced. A deadline of ``DeadlineArithmetic/never`` keeps the
    /// entry pending without ever waking the scheduler thread; a deadline in the
    /// past fires as soon as possible.
    ///
    /// - Complexity: O(1) in the number of armed entries (see ``TimerWheel``);
    ///   wakes the scheduler thread only when `deadline` is earlier than the
    ///   time it sleeps until.
    @discardableResult
    func arm(_ entry: any TimerEntry, at deadline: Int64) -> UInt64 {
        lock.lock()
        let state = self.state
        state.pointee.lastSequence &+= 1
        let sequence = state.pointee.lastSequence
        if state.pointee.shuttingDown {
            // A manual scheduler that was released: its time can never move
            // again, so keeping the entry would only leak it.
            lock.unlock()
            return sequence
        }
        let node = entry.timerSlot
        if node >= 0 {
            state.pointee.wheel.update(node: Int32(truncatingIfNeeded: node), deadline: deadline, sequence: sequence)
        } else {
            state.pointee.wheel.insert(entry, deadline: deadline, sequence: sequence)
        }
        if !isVirtual {
            if !state.pointee.threadStarted {
                state.pointee.threadStarted = true
                startThread()
            } else if deadline < state.pointee.sleepingUntil {
                // The thread would wake too late for this entry. (An entry whose
                // deadline is no earlier needs nothing: the thread wakes first
                // and looks at the wheel again.)
                state.pointee.sleepingUntil = Int64.min
                lock.signal()
            }
        }
        lock.unlock()
        return sequence
    }

    /// Disarms `entry` if it is armed; returns whether it was.
    ///
    /// The engine drops its reference to the entry before returning, outside its
    /// lock. It never wakes the scheduler thread: if the entry was the earliest,
    /// the thread may wake once at that time, find nothing due and sleep again.
    ///
    /// - Complexity: O(1) in the number of armed entries.
    @discardableResult
    func disarm(_ entry: any TimerEntry) -> Bool {
        lock.lock()
        let node = entry.timerSlot
        let removed = node >= 0 ? state.pointee.wheel.remove(node: Int32(truncatingIfNeeded: node)) : nil
        if state.pointee.retired && state.pointee.wheel.count == 0 {
            lock.signal()  // a retired engine's thread may end now
        }
        lock.unlock()
        // `removed` (and with it possibly the last reference to the entry) is
        // released here, outside the lock.
        return removed != nil
    }

    // MARK: Sleepers

    /// A task is now suspended in a sleep on this engine's clock (manual engines
    /// count them for ``waitForSleepers(_:)``).
    func sleeperArmed() {
        guard isVirtual else { return }
        lock.lock()
        state.pointee.sleepers += 1
        let count = state.pointee.sleepers
        var ready: [CheckedContinuation<Void, Never>] = []
        state.pointee.sleeperWaiters.removeAll { waiter in
            guard waiter.count <= count else { return false }
            ready.append(waiter.continuation)
            return true
        }
        lock.unlock()
        for continuation in ready { continuation.resume() }
    }

    /// A sleep on this engine's clock ended (its deadline passed or it was cancelled).
    func sleeperEnded() {
        guard isVirtual else { return }
        lock.withLock { state.pointee.sleepers -= 1 }
    }

    /// Tasks suspended in a sleep on this engine's clock (manual engines).
    public var sleeperCount: Int { lock.withLock { state.pointee.sleepers } }

    /// Returns once at least `count` tasks are suspended in a sleep on this
    /// engine's clock (manual engines).
    public func waitForSleepers(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.lock()
            if state.pointee.sleepers >= count {
                lock.unlock()
                continuation.resume()
            } else {
                state.pointee.sleeperWaiters.append((count, continuation))
                lock.unlock()
            }
        }
    }

    // MARK: Virtual time

    /// Manual engines: queues a handler delivery for the advancing thread.
    ///
    /// Under virtual time no handler runs outside `advance`: a delivery made by
    /// `start()`, by a call such as `Throttler.call`, or by a handler that ends
    /// while more are owed is queued here, and the advance loop runs the queue
    /// iteratively, in order, before it looks at the wheel again. So owed
    /// invocations never nest on the stack, however many there are.
    func enqueueDelivery(_ body: @escaping @Sendable () -> Void) {
        lock.lock()
        let dropped = state.pointee.shuttingDown
        if !dropped {
            let state = self.state
            let sequence: UInt64
            if let firing = state.pointee.firing, firing.thread == ThreadIdentity.current() {
                sequence = firing.sequence
            } else {
                state.pointee.lastSequence &+= 1
                sequence = state.pointee.lastSequence
            }
            // Kept sorted by sequence (stable): almost always an append.
            var index = state.pointee.deliveries.count
            while index > state.pointee.deliveryHead && state.pointee.deliveries[index - 1].sequence > sequence {
                index -= 1
            }
            state.pointee.deliveries.insert((sequence, body), at: index)
        }
        lock.unlock()
        if dropped { _ = body }  // released outside the lock
    }

    /// Takes the oldest queued delivery (lock held).
    private func popDelivery() -> (@Sendable () -> Void)? {
        let state = self.state
        guard state.pointee.deliveryHead < state.pointee.deliveries.count else { return nil }
        let body = state.pointee.deliveries[state.pointee.deliveryHead].body
        state.pointee.deliveryHead += 1
        if state.pointee.deliveryHead == state.pointee.deliveries.count {
            state.pointee.deliveries.removeAll(keepingCapacity: true)
            state.pointee.deliveryHead = 0
        }
        return body
    }

    /// How many handler deliveries wait for the next advance (manual engines).
    public var queuedDeliveryCount: Int {
        lock.withLock { state.pointee.deliveries.count - state.pointee.deliveryHead }
    }

    /// Moves the virtual clock forward by `duration`, firing every entry that falls
    /// due, in deadline order (ties in arming order), synchronously on this thread,
    /// including entries armed by those firings when they fall due within the
    /// advance. A non-positive `duration` fires only what is already due.
    public func advance(by duration: Duration) {
        precondition(isVirtual, "advance(by:) needs a manual engine")
        let target = lock.withLock {
            DeadlineArithmetic.deadline(now: state.pointee.virtualNow, after: duration)
        }
        advance(toTicks: target)
    }

    /// Moves the virtual clock to `instant` (time since the engine was created;
    /// never backwards, saturating), firing as ``advance(by:)`` does.
    public func advance(to instant: Duration) {
        advance(toTicks: max(0, DeadlineArithmetic.nanoseconds(instant)))
    }

    /// Moves the virtual clock to `target` ticks (never backwards), firing as
    /// ``advance(by:)`` does.
    ///
    /// One rule keeps every advance finite: an entry armed during the advance for
    /// an instant the clock has already reached (a zero or negative delay, say a
    /// `DelayedWork` that schedules itself again with `.zero`) does not run at
    /// that instant: it runs at the next instant the advance moves to, or in the
    /// next advance. So an entry that keeps re-arming itself with a zero delay
    /// runs once per instant, never in an endless loop. Queued deliveries (a
    /// `firesImmediately` tick, owed invocations) run, in order, before the clock
    /// moves on; if handlers keep queueing more at one instant (100,000 of them:
    /// far beyond any catch-up), the advance stops at that instant and the rest
    /// waits for the next advance. A target beyond the end of time stops one tick
    /// before "never"; a target in the past runs what is due now.
    public func advance(toTicks requested: Int64) {
        precondition(isVirtual, "advance(to:) needs a manual engine")
        let state = self.state
        var deferred: [TimerWheel.Fired] = []
        lock.lock()
        var barrier = state.pointee.lastSequence
        // The end of time is one tick before "never", so that work armed with no
        // delay there still runs; a target in the past runs what is due now.
        let target = max(min(requested, DeadlineArithmetic.never - 1), state.pointee.virtualNow)
        lock.unlock()
        var deliveriesAtInstant = 0
        while true {
            lock.lock()
            if deliveriesAtInstant >= Self.deliveryLimitPerInstant
                && state.pointee.deliveryHead < state.pointee.deliveries.count
            {
                // Handlers keep triggering each other at this instant (a zero-interval
                // throttler whose action calls it again): stop here, the clock where
                // it is, the rest queued for the next advance.
                reinsert(deferred)
                lock.unlock()
                return
            }
            if state.pointee.deliveryHead < state.pointee.deliveries.count {
                deliveriesAtInstant += 1
                // A delivery is queued for now; an entry due now that was armed
                // before it (a smaller sequence) goes first.
                let sequence = state.pointee.deliveries[state.pointee.deliveryHead].sequence
                if let fired = state.pointee.wheel.popDue(now: state.pointee.virtualNow) {
                    if fired.sequence < sequence && fired.sequence <= barrier {
                        lock.unlock()
                        fire(fired)
                        continue
                    }
                    state.pointee.wheel.insert(fired.entry, deadline: fired.deadline, sequence: fired.sequence)
                }
                let delivery = popDelivery()!
                lock.unlock()
                delivery()
                continue
            }
            guard let fired = state.pointee.wheel.popDue(now: target) else {
                reinsert(deferred)
                state.pointee.virtualNow = max(state.pointee.virtualNow, target)
                lock.unlock()
                return
            }
            if fired.deadline <= state.pointee.virtualNow && fired.sequence > barrier {
                // Armed at this instant for this instant: the next one.
                deferred.append(fired)
                lock.unlock()
                continue
            }
            if fired.deadline > state.pointee.virtualNow {
                state.pointee.virtualNow = fired.deadline
                barrier = state.pointee.lastSequence
                deliveriesAtInstant = 0
                if !deferred.isEmpty {
                    // The clock moved on: what was deferred runs now, before this.
                    reinsert(deferred + [fired])
                    deferred.removeAll()
                    lock.unlock()
                    continue
                }
            }
            lock.unlock()
            fire(fired)
        }
    }

    /// Fires `fired` on the advancing thread. Deliveries its firing queues take
    /// the entry's own sequence number, so they run in the entry's arming order
    /// among everything due at this instant.
    private func fire(_ fired: TimerWheel.Fired) {
        lock.lock()
        state.pointee.firing = (ThreadIdentity.current(), fired.sequence)
        lock.unlock()
        fired.entry.timerFired(deadline: fired.deadline, sequence: fired.sequence, engine: self)
        lock.lock()
        state.pointee.firing = nil
        lock.unlock()
    }

    /// Puts deferred firings back in the wheel, unless their entry was armed
    /// again meanwhile (then the newer arming stands). Lock held.
    private func reinsert(_ firings: [TimerWheel.Fired]) {
        for fired in firings where fired.entry.timerSlot < 0 {
            state.pointee.wheel.insert(fired.entry, deadline: fired.deadline, sequence: fired.sequence)
        }
    }

    /// The earliest armed deadline in ticks, if any.
    /// ``DeadlineArithmetic/never`` when only entries that never fire are armed.
    public var nextDeadline: Int64? { lock.withLock { state.pointee.wheel.earliestDeadline() } }

    // MARK: The scheduler thread

    /// Drops every armed entry and queued delivery for good: what a released
    /// manual scheduler does, since its time can never move again. Later armings
    /// are ignored.
    public func shutDown() {
        lock.lock()
        state.pointee.shuttingDown = true
        let dropped = state.pointee.wheel.removeAll()
        let deliveries = state.pointee.deliveries.map(\.body)
        state.pointee.deliveries = []
        state.pointee.deliveryHead = 0
        lock.signal()
        lock.unlock()
        _ = (dropped, deliveries)  // released outside the lock
    }

    /// The scheduler object was released. A real engine keeps firing what is
    /// armed (primitives keep their engine, so nothing armed is dropped); its
    /// thread ends once nothing is armed and starts again if something is.
    public func retire() {
        lock.lock()
        state.pointee.retired = true
        lock.signal()
        lock.unlock()
    }

    private func startThread() {
        // The thread keeps the engine alive until `shutDown()` lets it end.
        NamedThread.start(name: "SafeTimers") { [self] in self.runSchedulerThread() }.detach()
    }

    private func runSchedulerThread() {
        var batch: [TimerWheel.Fired] = []
        batch.reserveCapacity(Self.batchLimit)
        let state = self.state
        ThreadIdentity.minimizeTimerSlack()
        lock.lock()
        state.pointee.schedulerThreadID = ThreadIdentity.currentKernelThreadID()
        while !state.pointee.shuttingDown {
            if state.pointee.retired && state.pointee.wheel.count == 0 {
                // Nothing armed and nobody left to arm through the scheduler: end
                // the thread; a primitive that arms again starts a new one.
                state.pointee.threadStarted = false
                state.pointee.schedulerThreadID = 0
                break
            }
            let now = MonotonicClock.nanoseconds() &- origin
            while batch.count < Self.batchLimit, let fired = state.pointee.wheel.popDue(now: now) {
                batch.append(fired)
            }
            if !batch.isEmpty {
                lock.unlock()
                for fired in batch {
                    fired.entry.timerFired(deadline: fired.deadline, sequence: fired.sequence, engine: self)
                }
                batch.removeAll(keepingCapacity: true)
                lock.lock()
                continue
            }
            let earliest = state.pointee.wheel.wakeUpTarget()
            let absolute = DeadlineArithmetic.adding(earliest, to: origin)
            if earliest == DeadlineArithmetic.never || absolute == DeadlineArithmetic.never {
                state.pointee.sleepingUntil = DeadlineArithmetic.never
                lock.wait()
            } else {
                state.pointee.sleepingUntil = earliest
                lock.wait(untilMonotonic: absolute)
            }
            state.pointee.sleepingUntil = Int64.min
            state.pointee.wakeUps += 1
        }
        lock.unlock()
    }
}
