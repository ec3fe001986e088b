import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The machinery behind every scheduler: timing wheels of armed entries, locks,
/// and either a real clock with one tickless thread (``SystemTimerScheduler``) or
/// a virtual clock advanced by hand (`ManualTimerScheduler` in `SafeTimersTesting`).
///
/// Both kinds share the wheel, the ordering rules within a wheel (deadline, then
/// arming order) and the arm/disarm paths, so what a test proves under virtual
/// time is the code that runs in production.
///
/// Time is kept as `Int64` nanoseconds since the engine was created ("ticks").
///
/// ## Shards
/// A real-time engine keeps its entries in several *shards*, each a lock and a
/// wheel on cache lines of its own (twice as many as processors, at most 64). A
/// thread arms into the shard it was given at its first arming (threads are
/// dealt out round-robin), and a cancel goes to the shard that holds the entry
/// (its number is in ``TimerEntry/timerSlot``). So threads that arm and cancel
/// at the same time take different locks and write different cache lines.
///
/// One scheduler thread serves every shard. Each shard publishes `target`, a
/// time before which it has nothing due (a lower bound: arming lowers it, the
/// scheduler thread sets it exactly when it looks at the shard). The thread
/// sleeps until the earliest target and publishes that time in `sleepingUntil`;
/// an arming that lowered its shard's target *reads* `sleepingUntil` and wakes
/// the thread only if the new deadline is earlier. Neither side can miss the
/// other: the arming stores the target and then reads `sleepingUntil`, the thread
/// stores `sleepingUntil` and then reads every target, all sequentially
/// consistent, and the wake-up itself is made under the thread's lock, which it
/// holds until it waits. The fast path of an arming writes only its shard.
///
/// Order: entries fire in deadline order across all shards; each wake-up merges
/// what it takes from the shards by deadline, and a shard that gives its batch
/// limit holds back, for the next round, whatever another shard gave that is due
/// later than the last entry the limited shard gave. Among entries due at the
/// same instant, arming order holds within a shard only (sequence numbers are
/// per shard: an engine-global one would be a shared write on every arming),
/// which covers the entries one thread armed, since an entry stays in the shard
/// it was armed into until it fires or is cancelled. Ties between shards (entries
/// armed by different threads, or an entry first armed by another thread and
/// re-armed by this one) fire in an unspecified order. A manual engine has one
/// shard, so virtual time orders everything exactly.
///
/// `@unchecked Sendable` invariant: every mutable stored value lives in the
/// `State` that `state` points to, read and written only while `lock` is held,
/// or in a shard's `ShardState`, read and written only while that shard's lock
/// is held (a manual engine's one shard uses `lock` itself); the atomics are
/// atomics; the remaining properties are immutable after `init`. (State sits
/// behind pointers allocated once, rather than in stored `var`s, so that the hot
/// paths pay no dynamic exclusivity check.)
@_spi(SchedulerImplementation)
public final class TimerEngine: @unchecked Sendable {
    /// Engine-wide mutable state; touched only with `lock` held.
    private struct State: ~Copyable {
        /// Virtual clock (manual engines only).
        var virtualNow: Int64 = 0
        var schedulerThreadID: Int32 = 0
        var shuttingDown = false
        /// Manual engines: handler deliveries waiting for the next advance, in
        /// order, each with a sequence number from the arming sequence, so that
        /// an entry armed earlier for the same instant runs first.
        var deliveries: [(deadline: Int64, sequence: UInt64, body: @Sendable () -> Void)] = []
        /// The advancing thread and the deadline and sequence of the entry it is
        /// firing: a delivery that firing makes is ordered as the entry.
        var firing: (thread: UInt, deadline: Int64, sequence: UInt64)?
        var deliveryHead = 0
        /// Scheduler-thread wake-ups, counted for tests and benchmarks.
        var wakeUps = 0
        /// Manual engines: tasks suspended in a sleep on the engine's clock, and
        /// the tests waiting for that count to reach theirs.
        var sleepers = 0
        /// Each open ``waitForSleepers(_:)`` call, by an identity of its own,
        /// from its start until it returns.
        var sleeperWaiters: [UInt64: SleeperWait] = [:]
        var nextSleeperWaiter: UInt64 = 0
    }

    /// One open ``waitForSleepers(_:)`` call.
    private enum SleeperWait {
        /// Started, not suspended yet.
        case starting
        /// Suspended until the sleeper count reaches `count`.
        case waiting(count: Int, continuation: CheckedContinuation<Void, Never>)
        /// Its task was cancelled before it suspended: it must not suspend.
        case cancelled
    }

    /// What one shard keeps; touched only with the shard's lock held.
    struct ShardState: ~Copyable {
        var wheel: TimerWheel
        /// The last arming's sequence number in this shard, before the shard
        /// number is added (see ``Shard/nextSequence()``).
        var lastSequence: UInt64 = 0
    }

    /// A lock and a wheel. See "Shards" above.
    ///
    /// A trivial value of pointers: fetching a shard from the engine counts no
    /// reference (a class here had every arming and cancel retain and release
    /// its shard, two more atomic writes per call). The engine owns what the
    /// pointers point to (``ShardMemory``) and frees it in its `deinit`.
    ///
    /// `state` is read and written only while the lock is held; `target` is
    /// atomic; the rest is immutable.
    struct Shard {
        /// Nothing in this shard is due before this time (ticks). On a cache line
        /// (two, against adjacent-line prefetching) of its own.
        let target: UnsafeMutablePointer<Atomic<Int64>>
        /// The shard's lock (the engine's own lock for a manual engine's one shard).
        let mutex: UnsafeMutablePointer<pthread_mutex_t>
        let state: UnsafeMutablePointer<ShardState>
        let number: Int

        @inline(__always)
        func lock() { pthread_mutex_lock(mutex) }

        @inline(__always)
        func unlock() { pthread_mutex_unlock(mutex) }

        @inline(__always)
        func withLock<Result>(_ body: () throws -> Result) rethrows -> Result {
            lock()
            defer { unlock() }
            return try body()
        }

        /// The next arming's sequence number (lock held): increasing within the
        /// shard, and never equal to another shard's, so an entry that moved
        /// between shards can still tell a stale firing from its current one.
        @inline(__always)
        func nextSequence() -> UInt64 {
            state.pointee.lastSequence &+= 1
            return state.pointee.lastSequence &<< TimerEngine.shardBits | UInt64(number)
        }
    }

    /// What a ``Shard`` points to, owned by the engine.
    private struct ShardMemory {
        let lock: ConditionLock
        let shard: Shard

        init(number: Int, lock: ConditionLock) {
            self.lock = lock
            let target = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 128)
                .bindMemory(to: Atomic<Int64>.self, capacity: 1)
            target.initialize(to: Atomic(DeadlineArithmetic.never))
            // Cache lines of its own (rounded up to 128 bytes, against adjacent-
            // line prefetching): shards' states allocated one after another
            // shared lines, and two threads arming in two shards wrote them both
            // (2 threads then ran at 1.0x one thread's throughput, not 2x).
            let state = UnsafeMutableRawPointer.allocate(
                byteCount: (MemoryLayout<ShardState>.size + 127) & ~127, alignment: 128
            ).bindMemory(to: ShardState.self, capacity: 1)
            state.initialize(to: ShardState(wheel: TimerWheel(slotTag: number << TimerEngine.shardShift)))
            shard = Shard(target: target, mutex: lock.mutex, state: state, number: number)
        }

        func free() {
            shard.state.deinitialize(count: 1)
            UnsafeMutableRawPointer(shard.state).deallocate()
            shard.target.deinitialize(count: 1)
            UnsafeMutableRawPointer(shard.target).deallocate()
        }
    }

    /// Shard numbers take this many low bits of a sequence number.
    static let shardBits: UInt64 = 6
    /// A shard's number sits this far up in ``TimerEntry/timerSlot``.
    static let shardShift = 32

    private let lock = ConditionLock()
    private let state: UnsafeMutablePointer<State>
    /// The shards, in memory allocated once: an `Array` here would have every
    /// arming thread write the array's reference count, one cache line for all.
    private let shards: UnsafeMutableBufferPointer<Shard>
    /// What the shards point to (their locks are kept alive here).
    private let shardMemory: [ShardMemory]
    /// The calling thread's shard (see ``ThreadShard``).
    @inline(__always)
    private var threadShard: Shard { shards[ThreadShard.current() & (shards.count &- 1)] }

    /// What the scheduler thread waits for: `Int64.min` while it is awake (it
    /// will look at every shard again before sleeping, so nobody needs to wake
    /// it), otherwise the time it sleeps until (`never` when untimed). Written
    /// with `lock` held; read by armings without it.
    private let sleepingUntil = Atomic<Int64>(Int64.min)
    /// Handler deliveries the scheduler thread collects while it fires a round
    /// (never opened on a manual engine).
    let deliveryBatch = DeliveryBatch()
    /// Whether a scheduler thread runs (or is being started) for this engine.
    private let threadStarted = Atomic<Bool>(false)
    /// The scheduler object is gone: a real engine's thread ends once nothing
    /// is armed (what is armed still fires); a manual engine is shut down.
    private let retired = Atomic<Bool>(false)
    /// Tests only: run by the scheduler thread right before it takes `lock` to
    /// sleep, the window where a release and a last cancel must not be missed.
    package let beforeSleepingForTesting = StateLock<(@Sendable () -> Void)?>(nil)
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

    /// The most entries the scheduler thread takes out of a shard per lock hold,
    /// so arming threads never wait behind a long batch.
    private static let batchLimit = 256

    /// How many shards a real-time engine has: twice the processors, rounded up
    /// to a power of two (a thread's shard is then a mask away), at most 64.
    static let realTimeShardCount: Int = {
        let processors = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        var count = 2
        while count < 2 * processors && count < 64 { count <<= 1 }
        return count
    }()

    /// The one shard of a manual engine.
    private var virtualShard: UnsafeMutablePointer<ShardState> { shards[0].state }

    /// Creates an engine. A real-time engine starts its thread at the first arm.
    public init(virtual: Bool) {
        isVirtual = virtual
        origin = virtual ? 0 : MonotonicClock.nanoseconds()
        state = .allocate(capacity: 1)
        state.initialize(to: State())
        let count = virtual ? 1 : Self.realTimeShardCount
        let lock = self.lock
        shardMemory = (0..<count).map { ShardMemory(number: $0, lock: virtual ? lock : ConditionLock()) }
        shards = .allocate(capacity: count)
        _ = shards.initialize(from: shardMemory.map(\.shard))
    }

    deinit {
        // A real engine ends once its scheduler is gone, nothing is armed and its
        // thread has ended; a manual one once nothing refers to it.
        var entries: [any TimerEntry] = []
        for shard in shards { entries += shard.state.pointee.wheel.removeAll() }
        _ = shards.deinitialize()
        shards.deallocate()
        for memory in shardMemory { memory.free() }
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

    /// How many entries are armed, not counting the engine's own helper entry
    /// (``DeliveryBatch``) nor entries the scheduler thread has taken out to fire.
    ///
    /// - Complexity: O(number of shards): takes every shard's lock in turn (not
    ///   all at once), so while other threads arm and cancel, the sum is not a
    ///   snapshot of one instant.
    public var pendingCount: Int {
        shards.reduce(0) { total, shard in
            total
                + shard.withLock {
                    // The batch's rescue entry is the engine's, not the user's.
                    shard.state.pointee.wheel.count - (deliveryBatch.isRescueArmed(inShard: shard.number) ? 1 : 0)
                }
        }
    }

    /// How many shards keep this engine's entries (1 for a manual engine).
    var shardCount: Int { shards.count }

    /// The Linux thread id of the scheduler thread, or 0 before it started.
    public var schedulerThreadID: Int32 { lock.withLock { state.pointee.schedulerThreadID } }

    /// How often the scheduler thread woke up (from a timed wait or a signal).
    public var wakeUpCount: Int { lock.withLock { state.pointee.wakeUps } }

    // MARK: Arming

    /// The shard that holds `entry`, locked, with its node; or, when it is not
    /// armed, the calling thread's shard, locked, and -1.
    ///
    /// The entry's slot is read before the lock is taken, so it is read again
    /// after: only the holder of the shard's lock takes an entry out of it (the
    /// scheduler thread when it fires), and only the entry's own arming (which
    /// its primitive serializes) puts it into a shard, so once the lock is held
    /// and the slot still names the shard, it stays there.
    @inline(__always)
    private func lockedShard<Entry: TimerEntry>(for entry: Entry) -> (Shard, Int32) {
        while true {
            let slot = entry.timerSlot
            let shard = slot >= 0 ? shards[slot &>> Self.shardShift] : threadShard
            shard.lock()
            let current = entry.timerSlot
            if current == slot {
                return (shard, current >= 0 ? Int32(truncatingIfNeeded: current) : -1)
            }
            if current < 0 && shard.number == threadShard.number {
                return (shard, -1)
            }
            shard.unlock()
        }
    }

    /// Arms `entry` at `deadline` (ticks), moving it if it is armed already.
    ///
    /// Returns the arming's sequence number: ``TimerEntry/timerFired(deadline:sequence:engine:)``
    /// receives it back, so an entry can ignore a firing that belongs to an arming
    /// it has since replaced. A deadline of ``DeadlineArithmetic/never`` keeps the
    /// entry pending without ever waking the scheduler thread; a deadline in the
    /// past fires as soon as possible.
    ///
    /// - Complexity: O(1) in the number of armed entries (see ``TimerWheel``);
    ///   takes the lock of one shard only, and wakes the scheduler thread only
    ///   when `deadline` is earlier than the time it sleeps until.
    @discardableResult
    func arm<Entry: TimerEntry>(_ entry: Entry, at deadline: Int64) -> UInt64 {
        if isVirtual { return armVirtual(entry, at: deadline) }
        let (shard, node) = lockedShard(for: entry)
        let sequence = shard.nextSequence()
        let published = shard.target.pointee.load(ordering: .relaxed)
        let lowered = deadline < published
        if node >= 0 {
            shard.state.pointee.wheel.update(node: node, deadline: deadline, sequence: sequence)
            if !lowered {
                // A move to a later time (a rescheduled `DelayedWork`, the
                // detector's early look moved at every answer): if it was the
                // shard's earliest, the published target is raised to the new
                // earliest, so that the scheduler thread does not wake at the
                // old time for nothing. (Raising is always safe: a thread that
                // read the old value wakes once, finds nothing due, sleeps again.)
                let exact = shard.state.pointee.wheel.wakeUpTarget()
                if exact > published { shard.target.pointee.store(exact, ordering: .sequentiallyConsistent) }
            }
        } else {
            shard.state.pointee.wheel.insert(entry, deadline: deadline, sequence: sequence)
        }
        if lowered { shard.target.pointee.store(deadline, ordering: .sequentiallyConsistent) }
        shard.unlock()
        if !threadStarted.load(ordering: .sequentiallyConsistent) {
            startThreadIfNeeded()
        } else if lowered && deadline < sleepingUntil.load(ordering: .sequentiallyConsistent) {
            wake(before: deadline)
        }
        return sequence
    }

    /// The scheduler thread would wake too late for `deadline`: wake it now.
    /// (An entry whose deadline is no earlier needs nothing: the thread wakes
    /// first and looks at every shard again.)
    private func wake(before deadline: Int64) {
        lock.lock()
        if deadline < sleepingUntil.load(ordering: .relaxed) {
            sleepingUntil.store(Int64.min, ordering: .sequentiallyConsistent)
            lock.signal()
        }
        lock.unlock()
    }

    /// A manual engine's arming: one shard, whose lock is `lock`.
    private func armVirtual(_ entry: any TimerEntry, at deadline: Int64) -> UInt64 {
        lock.lock()
        let shard = shards[0]
        let sequence = shard.nextSequence()
        if state.pointee.shuttingDown {
            // A manual scheduler that was released: its time can never move
            // again, so keeping the entry would only leak it.
            lock.unlock()
            return sequence
        }
        let slot = entry.timerSlot
        if slot >= 0 {
            virtualShard.pointee.wheel.update(
                node: Int32(truncatingIfNeeded: slot), deadline: deadline, sequence: sequence)
        } else {
            virtualShard.pointee.wheel.insert(entry, deadline: deadline, sequence: sequence)
        }
        lock.unlock()
        return sequence
    }

    /// Disarms `entry` if it is armed; returns whether it was.
    ///
    /// The engine drops its reference to the entry before returning, outside its
    /// lock. It never wakes the scheduler thread (unless the engine is retired and
    /// may now end it): if the entry was the earliest, the thread may wake once at
    /// that time, find nothing due and sleep again.
    ///
    /// - Complexity: O(1) in the number of armed entries; takes the lock of the
    ///   shard that holds the entry only.
    @discardableResult
    func disarm<Entry: TimerEntry>(_ entry: Entry) -> Bool {
        guard entry.timerSlot >= 0 else { return false }
        let (shard, node) = lockedShard(for: entry)
        var removed = TimerEntryReference.none
        if node >= 0 {
            removed = shard.state.pointee.wheel.removeKeepingSlot(node: node)
            entry.timerSlot = -1
        }
        let emptied = shard.state.pointee.wheel.count == 0
        shard.unlock()
        if emptied && !isVirtual && retired.load(ordering: .relaxed) {
            lock.withLock { lock.signal() }  // a retired engine's thread may end now
        }
        // The engine's reference (possibly the last one to the entry) is
        // released here, outside the lock.
        let wasArmed = !removed.isNone
        removed.release()
        return wasArmed
    }

    // MARK: Sleepers

    /// A task is now suspended in a sleep on this engine's clock (manual engines
    /// count them for ``waitForSleepers(_:)``).
    ///
    /// The caller holds the sleep's own lock, the one it armed the entry under,
    /// so the sleep's firing or cancel (which take the continuation out under
    /// that lock) can only uncount it after this counted it. Returns the waits
    /// now satisfied: the caller resumes them once it has released its lock.
    func sleeperArmed() -> [CheckedContinuation<Void, Never>] {
        guard isVirtual else { return [] }
        return lock.withLock {
            state.pointee.sleepers += 1
            let count = state.pointee.sleepers
            var ready: [CheckedContinuation<Void, Never>] = []
            for (id, wait) in state.pointee.sleeperWaiters {
                guard case .waiting(let needed, let continuation) = wait, needed <= count else { continue }
                state.pointee.sleeperWaiters[id] = nil
                ready.append(continuation)
            }
            return ready
        }
    }

    /// A sleep on this engine's clock ended (its deadline passed or it was cancelled).
    func sleeperEnded() {
        guard isVirtual else { return }
        lock.withLock { state.pointee.sleepers -= 1 }
    }

    /// Tasks suspended in a sleep on this engine's clock (manual engines).
    public var sleeperCount: Int { lock.withLock { state.pointee.sleepers } }

    /// The ``waitForSleepers(_:)`` calls that have not returned (for leak tests).
    public var sleeperWaitCount: Int { lock.withLock { state.pointee.sleeperWaiters.count } }

    /// Returns once at least `count` tasks are suspended in a sleep on this
    /// engine's clock (manual engines), or at once when the calling task is
    /// cancelled (then its registration is gone).
    public func waitForSleepers(_ count: Int) async {
        let id = lock.withLock {
            state.pointee.nextSleeperWaiter &+= 1
            state.pointee.sleeperWaiters[state.pointee.nextSleeperWaiter] = .starting
            return state.pointee.nextSleeperWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = lock.withLock { () -> Bool in
                    guard case .starting = state.pointee.sleeperWaiters[id], state.pointee.sleepers < count else {
                        state.pointee.sleeperWaiters[id] = nil
                        return true
                    }
                    state.pointee.sleeperWaiters[id] = .waiting(count: count, continuation: continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            endSleeperWait(id)
        }
    }

    /// The task of the wait `id` was cancelled: ends the wait if it is
    /// suspended, or keeps it from suspending if it has not yet; nothing if it
    /// has ended.
    private func endSleeperWait(_ id: UInt64) {
        let suspended = lock.withLock { () -> CheckedContinuation<Void, Never>? in
            switch state.pointee.sleeperWaiters[id] {
            case .starting:
                state.pointee.sleeperWaiters[id] = .cancelled
                return nil
            case .waiting(_, let continuation):
                state.pointee.sleeperWaiters[id] = nil
                return continuation
            case .cancelled, nil:
                return nil
            }
        }
        suspended?.resume()
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
            let key: (deadline: Int64, sequence: UInt64)
            if let firing = state.pointee.firing, firing.thread == ThreadIdentity.current() {
                key = (firing.deadline, firing.sequence)
            } else {
                key = (state.pointee.virtualNow, shards[0].nextSequence())
            }
            // Kept sorted by deadline, then sequence (stable): almost always an append.
            var index = state.pointee.deliveries.count
            while index > state.pointee.deliveryHead
                && key < (state.pointee.deliveries[index - 1].deadline, state.pointee.deliveries[index - 1].sequence)
            {
                index -= 1
            }
            state.pointee.deliveries.insert((key.deadline, key.sequence, body), at: index)
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
    /// next advance, in (deadline, arming) order with everything else; until
    /// then it is pending like any armed entry (counted, and a cancel removes
    /// it). So an entry that keeps re-arming itself with a zero delay runs once
    /// per instant, never in an endless loop. Queued deliveries (a
    /// `firesImmediately` tick, owed invocations) run, in order, before the clock
    /// moves on; if handlers keep queueing more at one instant (100,000 of them:
    /// far beyond any catch-up), the advance stops at that instant and the rest
    /// waits for the next advance. A target beyond the end of time stops one tick
    /// before "never"; a target in the past runs what is due now.
    public func advance(toTicks requested: Int64) {
        precondition(isVirtual, "advance(to:) needs a manual engine")
        let state = self.state
        // Firings deferred by the rule above: parked in the wheel at "never"
        // (pending, counted, cancellable like any armed entry) until the clock
        // moves on, then put back at their own deadline and sequence.
        var deferred: [TimerWheel.Fired] = []
        lock.lock()
        var barrier = virtualShard.pointee.lastSequence &<< Self.shardBits
        // The end of time is one tick before "never", so that work armed with no
        // delay there still runs; a target in the past runs what is due now.
        let target = max(min(requested, DeadlineArithmetic.never - 1), state.pointee.virtualNow)
        lock.unlock()
        var deliveriesAtInstant = 0
        while true {
            lock.lock()
            if state.pointee.deliveryHead < state.pointee.deliveries.count {
                guard deliveriesAtInstant < Self.deliveryLimitPerInstant else {
                    // Handlers keep triggering each other at this instant (a
                    // zero-interval throttler whose action calls it again): stop
                    // here, the clock where it is, the rest queued for the next advance.
                    unpark(deferred)
                    lock.unlock()
                    return
                }
                deliveriesAtInstant += 1
                runFirstInOrder(barrier: barrier)
                continue
            }
            guard let fired = virtualShard.pointee.wheel.popDue(now: target) else {
                unpark(deferred)
                state.pointee.virtualNow = max(state.pointee.virtualNow, target)
                lock.unlock()
                return
            }
            if fired.deadline <= state.pointee.virtualNow && fired.sequence > barrier {
                // Armed at this instant for this instant: the next one.
                virtualShard.pointee.wheel.insert(
                    fired.entry, deadline: DeadlineArithmetic.never, sequence: fired.sequence)
                deferred.append(fired)
                lock.unlock()
                continue
            }
            if fired.deadline > state.pointee.virtualNow {
                state.pointee.virtualNow = fired.deadline
                barrier = virtualShard.pointee.lastSequence &<< Self.shardBits
                deliveriesAtInstant = 0
                if !deferred.isEmpty {
                    // The clock moved on: what was deferred runs now, in order with this.
                    unpark(deferred)
                    virtualShard.pointee.wheel.insert(fired.entry, deadline: fired.deadline, sequence: fired.sequence)
                    lock.unlock()
                    deferred.removeAll()
                    continue
                }
            }
            lock.unlock()
            fire(fired)
        }
    }

    /// Runs the first queued delivery, or the entry due now that goes before it:
    /// one that precedes it in (deadline, sequence) order and was armed before
    /// this instant began (`barrier`). Called with the lock held; returns
    /// without it.
    private func runFirstInOrder(barrier: UInt64) {
        let head = state.pointee.deliveries[state.pointee.deliveryHead]
        if let fired = virtualShard.pointee.wheel.popDue(now: state.pointee.virtualNow) {
            if (fired.deadline, fired.sequence) < (head.deadline, head.sequence) && fired.sequence <= barrier {
                lock.unlock()
                fire(fired)
                return
            }
            virtualShard.pointee.wheel.insert(fired.entry, deadline: fired.deadline, sequence: fired.sequence)
        }
        let delivery = popDelivery()!
        lock.unlock()
        delivery()
    }

    /// Fires `fired` on the advancing thread. Deliveries its firing queues take
    /// the entry's own sequence number, so they run in the entry's arming order
    /// among everything due at this instant.
    private func fire(_ fired: TimerWheel.Fired) {
        lock.lock()
        state.pointee.firing = (ThreadIdentity.current(), fired.deadline, fired.sequence)
        lock.unlock()
        fired.entry.timerFired(deadline: fired.deadline, sequence: fired.sequence, engine: self)
        lock.lock()
        state.pointee.firing = nil
        lock.unlock()
    }

    /// Puts parked firings back at their own deadline and sequence, unless
    /// their entry was disarmed or armed again meanwhile (then that stands).
    /// Lock held.
    private func unpark(_ firings: [TimerWheel.Fired]) {
        for fired in firings where fired.entry.timerSlot >= 0 {
            virtualShard.pointee.wheel.unpark(
                node: Int32(truncatingIfNeeded: fired.entry.timerSlot), deadline: fired.deadline,
                sequence: fired.sequence)
        }
    }

    /// The earliest armed deadline in ticks, if any.
    /// ``DeadlineArithmetic/never`` when only entries that never fire are armed.
    public var nextDeadline: Int64? {
        var earliest: Int64? = nil
        for shard in shards {
            if let deadline = shard.withLock({ shard.state.pointee.wheel.earliestDeadline() }) {
                earliest = min(earliest ?? deadline, deadline)
            }
        }
        return earliest
    }

    // MARK: The scheduler thread

    /// Drops every armed entry and queued delivery for good: what a released
    /// manual scheduler does, since its time can never move again. Later armings
    /// are ignored.
    public func shutDown() {
        lock.lock()
        state.pointee.shuttingDown = true
        let deliveries = state.pointee.deliveries.map(\.body)
        state.pointee.deliveries = []
        state.pointee.deliveryHead = 0
        lock.signal()
        lock.unlock()
        var dropped: [any TimerEntry] = []
        for shard in shards {
            shard.lock()
            dropped += shard.state.pointee.wheel.removeAll()
            shard.unlock()
        }
        _ = (dropped, deliveries)  // released outside the locks
    }

    /// The scheduler object was released. A real engine keeps firing what is
    /// armed (primitives keep their engine, so nothing armed is dropped); its
    /// thread ends once nothing is armed and starts again if something is.
    public func retire() {
        retired.store(true, ordering: .sequentiallyConsistent)
        lock.lock()
        lock.signal()
        lock.unlock()
    }

    /// Starts the scheduler thread unless one runs.
    private func startThreadIfNeeded() {
        guard isVirtual == false,
            threadStarted.compareExchange(expected: false, desired: true, ordering: .sequentiallyConsistent).exchanged
        else { return }
        // The thread keeps the engine alive until it ends.
        NamedThread.start(name: "SafeTimers") { [self] in self.runSchedulerThread() }.detach()
    }

    /// Whether every shard is empty (takes each shard's lock in turn).
    private var isEmpty: Bool {
        shards.allSatisfy { shard in shard.withLock { shard.state.pointee.wheel.count == 0 } }
    }

    private func runSchedulerThread() {
        var batch: [TimerWheel.Fired] = []
        batch.reserveCapacity(Self.batchLimit)
        ThreadIdentity.minimizeTimerSlack()
        lock.withLock { state.pointee.schedulerThreadID = ThreadIdentity.currentKernelThreadID() }
        while true {
            if retired.load(ordering: .sequentiallyConsistent) && batch.isEmpty && isEmpty {
                if endsSchedulerThread() { return }
                continue
            }
            let round = collectDue(into: &batch, now: MonotonicClock.nanoseconds() &- origin)
            if !batch.isEmpty {
                fire(&batch, round)
                continue
            }
            if let hook = beforeSleepingForTesting.withLock({ $0 }) { hook() }
            guard sleepUntilNextTarget() else { return }
        }
    }

    /// Nothing armed and nobody left to arm through the scheduler: the thread
    /// ends (true); a primitive that arms again starts a new one. An arming that
    /// saw the thread still running is caught by the second look (it arms, then
    /// reads `threadStarted`; this clears it, then looks): then this thread goes
    /// on (false), or ends if another was started meanwhile.
    private func endsSchedulerThread() -> Bool {
        threadStarted.store(false, ordering: .sequentiallyConsistent)
        if !isEmpty,
            threadStarted.compareExchange(expected: false, desired: true, ordering: .sequentiallyConsistent).exchanged
        {
            return false
        }
        lock.withLock { state.pointee.schedulerThreadID = 0 }
        return true
    }

    /// What one round took: the latest deadline it may fire (a shard that hit the
    /// batch limit still holds entries due no earlier than the last one taken from
    /// it), and whether its entries came from more than one place.
    private struct Round {
        var cut = Int64.max
        var fromSeveralShards: Bool
    }

    /// Takes what is due at `now` from every shard whose target has come, at most
    /// `batchLimit` a shard, after the entries carried over from the last round.
    private func collectDue(into batch: inout [TimerWheel.Fired], now: Int64) -> Round {
        var round = Round(fromSeveralShards: !batch.isEmpty)
        var firstShard = -1
        for shard in shards where shard.target.pointee.load(ordering: .sequentiallyConsistent) <= now {
            shard.lock()
            let before = batch.count
            while batch.count - before < Self.batchLimit, let fired = shard.state.pointee.wheel.popDue(now: now) {
                batch.append(fired)
            }
            let limited = batch.count - before == Self.batchLimit
            let target = limited ? now : shard.state.pointee.wheel.wakeUpTarget()
            shard.target.pointee.store(target, ordering: .sequentiallyConsistent)
            shard.unlock()
            if limited { round.cut = min(round.cut, batch[batch.count - 1].deadline) }
            if batch.count > before {
                if firstShard < 0 { firstShard = shard.number } else { round.fromSeveralShards = true }
            }
        }
        return round
    }

    /// Fires the round's entries up to its cut, in one delivery batch; what is due
    /// later stays in `batch` for the next round, which takes the rest of the
    /// limited shard first (its target is now).
    private func fire(_ batch: inout [TimerWheel.Fired], _ round: Round) {
        if round.fromSeveralShards {
            // Deadline order across shards; among equal deadlines, sequence order,
            // which is a shard's own order (its sequences increase with its
            // armings, and an entry it gives later at the same deadline was armed
            // later or sat behind in its wheel); between shards it is merely a
            // total order. In place: no allocation.
            batch.sort { ($0.deadline, $0.sequence) < ($1.deadline, $1.sequence) }
        }
        var firing = batch.count
        if round.cut != Int64.max {
            firing = batch.firstIndex { $0.deadline > round.cut } ?? batch.count
        }
        deliveryBatch.open()
        for fired in batch[..<firing] {
            fired.entry.timerFired(deadline: fired.deadline, sequence: fired.sequence, engine: self)
        }
        deliveryBatch.close(engine: self)
        batch.removeFirst(firing)
    }

    /// Sleeps until the earliest shard target (or a signal). False when the
    /// engine shuts down: the thread ends.
    private func sleepUntilNextTarget() -> Bool {
        lock.lock()
        defer { lock.unlock() }
        if state.pointee.shuttingDown { return false }
        var earliest = DeadlineArithmetic.never
        for shard in shards { earliest = min(earliest, shard.target.pointee.load(ordering: .relaxed)) }
        sleepingUntil.store(earliest, ordering: .sequentiallyConsistent)
        defer { sleepingUntil.store(Int64.min, ordering: .sequentiallyConsistent) }
        // The second look (see "Shards"): an arming that lowered a target
        // before it could see `sleepingUntil` is seen here.
        var again = DeadlineArithmetic.never
        for shard in shards { again = min(again, shard.target.pointee.load(ordering: .sequentiallyConsistent)) }
        let absolute = DeadlineArithmetic.adding(earliest, to: origin)
        if again < earliest || earliest <= MonotonicClock.nanoseconds() &- origin { return true }
        if retired.load(ordering: .sequentiallyConsistent) && isEmpty {
            // A retired engine emptied since the look at the top: end the thread
            // there. The cancel that empties a shard signals under `lock` after
            // emptying it, so this look (under `lock`) sees the emptying, or that
            // signal comes once this thread waits: no periodic look is needed.
            return true
        }
        if earliest == DeadlineArithmetic.never || absolute == DeadlineArithmetic.never {
            lock.wait()
        } else {
            lock.wait(untilMonotonic: absolute)
        }
        state.pointee.wakeUps += 1
        return true
    }
}

/// Which shard a thread arms into: each thread is given a number at its first
/// arming, round-robin, so that threads spread over the shards evenly (a hash of
/// the thread's id would put two of two threads in one shard a quarter of the
/// time). An engine takes the number modulo its shard count.
enum ThreadShard {
    /// The calling thread's number (see ``ThreadIdentity/shard()``).
    @inline(__always)
    static func current() -> Int { ThreadIdentity.shard() }
}
