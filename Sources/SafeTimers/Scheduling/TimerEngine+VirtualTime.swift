import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// Virtual time: a manual engine fires its entries inside `advance(by:)`, on the
// advancing thread, and runs the handler deliveries they queue there.
extension TimerEngine {
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
}
