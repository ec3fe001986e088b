import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// The scheduler thread of a real-time engine: it sleeps until the earliest
// shard target, takes what is due from every shard and fires it in deadline order.
extension TimerEngine {
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
        var dropped: [TimerEntry] = []
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
    func startThreadIfNeeded() {
        guard isVirtual == false,
            threadStarted.compareExchange(expected: false, desired: true, ordering: .sequentiallyConsistent).exchanged
        else { return }
        // The thread keeps the engine alive until it ends.
        switch NamedThread.tryStart(name: "SafeTimers", { [self] in self.runSchedulerThread() }) {
        case .success(let thread):
            thread.detach()
        case .failure(let error):
            // The system refused a thread (a thread or process limit reached):
            // never a trap. What is armed stays armed; the next arming tries
            // again, and everything due fires once a thread runs.
            threadStarted.store(false, ordering: .sequentiallyConsistent)
            Self.reportThreadRefused(error.code)
        }
    }

    /// Says once per process, on standard error, that the scheduler thread could
    /// not be started, naming `pthread_create`'s error.
    private static func reportThreadRefused(_ code: Int32) {
        guard !threadRefusalReported.exchange(true, ordering: .relaxed) else { return }
        let message =
            "SafeTimers: the system refused the scheduler thread (pthread_create returned \(code)); "
            + "timers stay armed and fire once a later arming can start it\n"
        _ = message.withCString { write(2, $0, strlen($0)) }
    }

    private static let threadRefusalReported = Atomic<Bool>(false)

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
            #if DEBUG
            if let hook = beforeSleepingForTesting.withLock({ $0 }) { hook() }
            #endif
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

    /// Fires the round's entries up to its cut, several in one delivery batch;
    /// what is due later stays in `batch` for the next round, which takes the
    /// rest of the limited shard first (its target is now).
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
        // One firing has nothing to share a hop with: it is delivered as it fires.
        let batching = firing > 1
        if batching { deliveryBatch.open() }
        for fired in batch[..<firing] {
            fired.entry.timerFired(deadline: fired.deadline, sequence: fired.sequence, engine: self)
        }
        if batching { deliveryBatch.close() }
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
