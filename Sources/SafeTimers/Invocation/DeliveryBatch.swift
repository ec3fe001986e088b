import Dispatch
import Synchronization

/// The handler deliveries a real-time engine's scheduler thread collects while
/// it fires one round of due entries, so that firings due together for the
/// same destination reach it in one hop instead of one each.
///
/// A hop carries at most ``handlersPerHop`` handlers, run one after another in
/// deadline order; a destination's hop leaves as soon as it is full, and the
/// rest when the round ends. A round with one firing per destination (the usual
/// case) makes one hop each, exactly as without batching.
///
/// A hop must not change what handlers can rely on, so it is *work-stealing*:
/// its handlers are claimed one at a time, and while any is still unclaimed one
/// millisecond after the hop went out, the scheduler thread sends one more
/// block to the same destination that claims and runs the rest (again every
/// millisecond while some remain, one block at a time per hop, and only once
/// the hop's earlier blocks have begun; a hop whose blocks have not all begun
/// is looked at again after twice the last wait, up to 128 ms, so that a hop
/// stuck behind itself on a serial queue, or on a suspended queue, does not
/// wake the scheduler thread every millisecond). So:
/// - on a serial queue, handlers run in deadline order, as with a hop each (a
///   helper block queues behind the hop and finds nothing left);
/// - on a concurrent queue (the global queue, the default), a handler that
///   blocks holds up the handlers after it in its hop for about a millisecond,
///   not until it returns; one that waits for another handler of its own hop
///   (a semaphore the other signals) is not a deadlock: the helper runs that one.
/// The main actor and a `SerialExecutor` are serial: their hops need no helper.
///
/// Deliveries made by any other thread (a `Throttler` call, a `start()`), and
/// all deliveries of a manual engine, go out at once as before.
///
/// `@unchecked Sendable` invariant: `groups` and `watched` are read and written
/// only by the engine's scheduler thread (between ``open()`` and ``close()``,
/// and in the rescue entry's firing, which that thread makes); `collector` and
/// the counters are atomic.
final class DeliveryBatch: @unchecked Sendable {
    /// The most handlers one hop runs.
    static let handlersPerHop = 16

    /// How long a hop's handlers may wait unclaimed before a helper block is sent.
    static let rescueDelay: Int64 = 1_000_000

    /// The longest a watched hop waits between two looks. A hop whose blocks
    /// have not all begun (its queue is serial and busy with the hop itself, or
    /// suspended, or starved) cannot use a helper yet: each look that finds it
    /// so doubles its wait up to this, so that it does not wake the scheduler
    /// thread every millisecond for as long as it stays so.
    static let longestRescueDelay: Int64 = 128_000_000

    fileprivate struct Invocation: Sendable {
        let target: any InvocationTarget
        let tag: UInt64
    }

    private struct Group {
        let destination: HandlerExecutor
        var invocations: [Invocation]
    }

    /// The collecting thread's ``ThreadIdentity/current()`` number; 0 when no
    /// round is open.
    private let collector = Atomic<UInt>(0)
    private var groups: [Group] = []
    /// Hops with handlers that may still be unclaimed, and when each went out.
    private var watched: [(hop: DeliveryHop, checkAt: Int64, delay: Int64)] = []
    /// The entry that wakes the scheduler thread to look at `watched`: the
    /// engine's own, never counted as pending (``isRescue(slot:shard:)``).
    private let rescue = HopRescue()
    private var rescueArmed = false
    /// Hops sent, handlers they carried, helper blocks sent (tests).
    private let hops = Atomic<Int>(0)
    private let carried = Atomic<Int>(0)
    private let helpers = Atomic<Int>(0)

    /// How many hops the batch has sent (tests).
    var hopCount: Int { hops.load(ordering: .relaxed) }

    /// How many handler invocations those hops carried (tests).
    var carriedCount: Int { carried.load(ordering: .relaxed) }

    /// How many helper blocks were sent for hops with unclaimed handlers (tests).
    var helperCount: Int { helpers.load(ordering: .relaxed) }

    init() {
        rescue.attach(to: self)
    }

    /// Whether the rescue entry is armed in shard `shard` (call with that shard's
    /// lock held, which orders the entry's slot).
    func isRescueArmed(inShard shard: Int) -> Bool {
        let slot = rescue.timerSlot
        return slot >= 0 && slot &>> TimerEngine.shardShift == shard
    }

    /// Whether the calling thread is collecting deliveries now. One relaxed load
    /// while no round is open.
    @inline(__always)
    var isCollectingHere: Bool {
        let thread = collector.load(ordering: .relaxed)
        return thread != 0 && thread == ThreadIdentity.current()
    }

    /// Starts collecting on the calling thread.
    func open() {
        collector.store(ThreadIdentity.current(), ordering: .relaxed)
    }

    /// Sends every collected delivery and stops collecting.
    func close(engine: TimerEngine) {
        collector.store(0, ordering: .relaxed)
        for group in groups where !group.invocations.isEmpty { send(group, engine: engine) }
        groups.removeAll(keepingCapacity: true)
    }

    /// Collects the invocation `tag` of `target` for `executor` (not a test
    /// recorder). Call only when ``isCollectingHere``.
    func add(_ target: some InvocationTarget, tag: UInt64, executor destination: HandlerExecutor, engine: TimerEngine) {
        let invocation = Invocation(target: target, tag: tag)
        for index in groups.indices where groups[index].destination.isSame(as: destination) {
            groups[index].invocations.append(invocation)
            if groups[index].invocations.count == Self.handlersPerHop {
                send(groups[index], engine: engine)
                groups[index].invocations = []
            }
            return
        }
        var invocations: [Invocation] = []
        invocations.reserveCapacity(4)
        invocations.append(invocation)
        groups.append(Group(destination: destination, invocations: invocations))
    }

    /// One hop for the group's handlers.
    private func send(_ group: Group, engine: TimerEngine) {
        let invocations = group.invocations
        hops.add(1, ordering: .relaxed)
        carried.add(invocations.count, ordering: .relaxed)
        if invocations.count == 1 {
            let only = invocations[0]
            group.destination.run { only.target.invoke(tag: only.tag) }
            return
        }
        let hop = DeliveryHop(destination: group.destination, invocations: invocations)
        group.destination.run { hop.drain() }
        guard !group.destination.isSerial else { return }
        let now = engine.nowTicks
        watched.append((hop, now &+ Self.rescueDelay, Self.rescueDelay))
        if !rescueArmed {
            rescueArmed = true
            engine.arm(rescue, at: now &+ Self.rescueDelay)
        }
    }

    /// The rescue entry fired (scheduler thread): a helper block for every hop
    /// sent a millisecond ago or more whose blocks have all begun and that still
    /// has unclaimed handlers; armed again while any hop may need one.
    fileprivate func rescueHops(engine: TimerEngine) {
        rescueArmed = false
        let now = engine.nowTicks
        var earliestPending = Int64.max
        watched.removeAll { $0.hop.isFullyClaimed }
        for index in watched.indices {
            let hop = watched[index].hop
            if now >= watched[index].checkAt {
                if hop.mayNeedHelper {
                    hop.helperSent()
                    helpers.add(1, ordering: .relaxed)
                    hop.destination.run { hop.drain() }
                    watched[index].delay = Self.rescueDelay
                } else {
                    watched[index].delay = min(watched[index].delay &* 2, Self.longestRescueDelay)
                }
                watched[index].checkAt = now &+ watched[index].delay
            }
            earliestPending = min(earliestPending, watched[index].checkAt)
        }
        if earliestPending != Int64.max {
            rescueArmed = true
            engine.arm(rescue, at: earliestPending)
        }
    }
}

/// One hop's handlers, claimed one at a time by the hop's block and any helper
/// block (see ``DeliveryBatch``).
final class DeliveryHop: Sendable {
    let destination: HandlerExecutor
    private let invocations: [DeliveryBatch.Invocation]
    /// The next handler to claim.
    private let cursor = Atomic<Int>(0)
    /// Blocks sent for this hop (the hop's own and helpers), and blocks begun.
    /// Sent is written only by the scheduler thread.
    private let sent = Atomic<Int>(1)
    private let begun = Atomic<Int>(0)

    fileprivate init(destination: HandlerExecutor, invocations: [DeliveryBatch.Invocation]) {
        self.destination = destination
        self.invocations = invocations
    }

    /// Claims and runs handlers until none is left.
    func drain() {
        begun.add(1, ordering: .relaxed)
        while true {
            let index = cursor.add(1, ordering: .relaxed).oldValue
            guard index < invocations.count else { return }
            invocations[index].target.invoke(tag: invocations[index].tag)
        }
    }

    /// Whether every handler has been claimed.
    var isFullyClaimed: Bool { cursor.load(ordering: .relaxed) >= invocations.count }

    /// Whether a helper would help: handlers are unclaimed and every block sent
    /// so far has begun (a hop still waiting in its queue needs none).
    fileprivate var mayNeedHelper: Bool {
        !isFullyClaimed && begun.load(ordering: .relaxed) >= sent.load(ordering: .relaxed)
    }

    fileprivate func helperSent() { sent.add(1, ordering: .relaxed) }
}

/// The engine entry that wakes the scheduler thread to send helper blocks.
final class HopRescue: TimerEntry {
    /// The batch that owns this entry (and outlives it), unretained; set once,
    /// before the entry is first armed.
    private let batch = Atomic<UInt>(0)
    private let slot = Atomic<Int>(-1)

    init() {}

    func attach(to owner: DeliveryBatch) {
        batch.store(UInt(bitPattern: Unmanaged.passUnretained(owner).toOpaque()), ordering: .releasing)
    }

    var timerSlot: Int {
        get { slot.load(ordering: .relaxed) }
        set { slot.store(newValue, ordering: .relaxed) }
    }

    func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        let address = batch.load(ordering: .acquiring)
        guard let pointer = UnsafeRawPointer(bitPattern: address) else { return }
        Unmanaged<DeliveryBatch>.fromOpaque(pointer).takeUnretainedValue().rescueHops(engine: engine)
    }
}

extension HandlerExecutor {
    /// Whether deliveries to both go to the same place (one batch group).
    fileprivate func isSame(as other: HandlerExecutor) -> Bool {
        if let mine = givenQueue {
            guard let theirs = other.givenQueue else { return false }
            return mine === theirs || (MainQueueMarker.isMain(mine) && MainQueueMarker.isMain(theirs))
        }
        switch (self, other) {
        case (.globalQueue, .globalQueue), (.mainActor, .mainActor): return true
        case (.serialExecutor(let mine), .serialExecutor(let theirs)): return mine.identity == theirs.identity
        case (.taskExecutor(let mine), .taskExecutor(let theirs)): return mine.identity == theirs.identity
        default: return false
        }
    }

    /// Whether handlers there run one at a time anyway (a hop there needs no
    /// helper block).
    fileprivate var isSerial: Bool {
        switch self {
        case .mainActor: return true
        case .serialExecutor: return true
        case .taskExecutor: return false
        case .queue, .leasedQueue: return givenQueue.map(MainQueueMarker.isMain) ?? false
        case .globalQueue, .recorder: return false
        }
    }
}
