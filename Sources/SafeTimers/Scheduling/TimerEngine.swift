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
    struct State: ~Copyable {
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
    enum SleeperWait {
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
    /// A trivial value of pointers, so that fetching a shard from the engine
    /// counts no reference (a class would cost every arming and cancel a retain
    /// and a release of its shard). The engine owns what the pointers point to
    /// (``ShardMemory``) and frees it in its `deinit`.
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
            // line prefetching): two threads arming in two shards must not write
            // the same line, or they take turns instead of running side by side.
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

    let lock = ConditionLock()
    let state: UnsafeMutablePointer<State>
    /// The shards, in memory allocated once: an `Array` here would have every
    /// arming thread write the array's reference count, one cache line for all.
    let shards: UnsafeMutableBufferPointer<Shard>
    /// What the shards point to (their locks are kept alive here).
    private let shardMemory: [ShardMemory]
    /// The calling thread's shard: each thread is given a number at its first
    /// arming, round-robin (``ThreadIdentity/shard()``), so that threads spread
    /// over the shards evenly.
    @inline(__always)
    private var threadShard: Shard { shards[ThreadIdentity.shard() & (shards.count &- 1)] }

    /// What the scheduler thread waits for: `Int64.min` while it is awake (it
    /// will look at every shard again before sleeping, so nobody needs to wake
    /// it), otherwise the time it sleeps until (`never` when untimed). Written
    /// with `lock` held; read by armings without it.
    let sleepingUntil = Atomic<Int64>(Int64.min)
    /// Handler deliveries the scheduler thread collects while it fires a round
    /// (never opened on a manual engine).
    let deliveryBatch = DeliveryBatch()
    /// Whether a scheduler thread runs (or is being started) for this engine.
    let threadStarted = Atomic<Bool>(false)
    /// The scheduler object is gone: a real engine's thread ends once nothing
    /// is armed (what is armed still fires); a manual engine is shut down.
    let retired = Atomic<Bool>(false)
    #if DEBUG
    /// Tests only (debug builds; release builds have neither the hook nor its
    /// check): run by the scheduler thread right before it takes `lock` to
    /// sleep, the window where a release and a last cancel must not be missed.
    let beforeSleepingForTesting = StateLock<(@Sendable () -> Void)?>(nil)
    #endif
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
    static let batchLimit = 256

    /// How many shards a real-time engine has: twice the processors, rounded up
    /// to a power of two (a thread's shard is then a mask away), at most 64.
    static let realTimeShardCount: Int = {
        let processors = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        var count = 2
        while count < 2 * processors && count < 64 { count <<= 1 }
        return count
    }()

    /// The one shard of a manual engine.
    var virtualShard: UnsafeMutablePointer<ShardState> { shards[0].state }

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
        var entries: [TimerEntry] = []
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

    /// How many entries are armed, not counting entries the scheduler thread has
    /// taken out to fire.
    ///
    /// - Complexity: O(number of shards): takes every shard's lock in turn (not
    ///   all at once), so while other threads arm and cancel, the sum is not a
    ///   snapshot of one instant.
    public var pendingCount: Int {
        shards.reduce(0) { total, shard in total + shard.withLock { shard.state.pointee.wheel.count } }
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
    private func lockedShard(for entry: TimerEntry) -> (Shard, Int32) {
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
    func arm(_ entry: TimerEntry, at deadline: Int64) -> UInt64 {
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
    private func armVirtual(_ entry: TimerEntry, at deadline: Int64) -> UInt64 {
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
    func disarm(_ entry: TimerEntry) -> Bool {
        guard entry.timerSlot >= 0 else { return false }
        let (shard, node) = lockedShard(for: entry)
        let removed = node >= 0 ? shard.state.pointee.wheel.remove(node: node) : nil
        let emptied = shard.state.pointee.wheel.count == 0
        shard.unlock()
        if emptied && !isVirtual && retired.load(ordering: .relaxed) {
            lock.withLock { lock.signal() }  // a retired engine's thread may end now
        }
        // The engine's reference (possibly the last one to the entry) is
        // released here, outside the lock.
        return withExtendedLifetime(removed) { removed != nil }
    }
}
