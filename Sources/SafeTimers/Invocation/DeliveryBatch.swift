import Dispatch
import Synchronization

/// The handler deliveries a real-time engine's scheduler thread collects while
/// it fires one round of due entries, so that firings due together for the
/// same destination reach it in one hop per ``handlersPerHop`` handlers, in
/// deadline order, instead of one each. A round with one firing per
/// destination (the usual case) makes one hop each, exactly as without
/// batching.
///
/// A hop must not change what handlers can rely on. Where handlers run one at
/// a time anyway (``HandlerExecutor/runsOneAtATime``: the main actor, a
/// `SerialExecutor`, the main queue) it runs them in order. Anywhere else (the
/// global queue, a given queue, which may be concurrent, a `TaskExecutor`, the
/// watchdogs' report queues, a new one per block) it
/// is *work-stealing* (``DeliveryHop``): before a block runs a handler while
/// others of its hop are unclaimed, it makes sure one more block is on its way
/// to the same destination, which claims and runs the rest. So a handler that
/// blocks never holds up the others of its hop, and one that waits for another
/// handler of its own hop is not a deadlock; on a serial queue the helper
/// queues behind the hop and finds nothing left.
///
/// Deliveries made by any other thread (a `Throttler` call, a `start()`), and
/// all deliveries of a manual engine, go out at once.
///
/// `@unchecked Sendable` invariant: `groups` is read and written only by the
/// engine's scheduler thread, between ``open()`` and ``close()``; `collector`
/// and the counters are atomic.
final class DeliveryBatch: @unchecked Sendable {
    /// The most handlers one hop runs.
    static let handlersPerHop = 16

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
    /// Hops sent and handlers they carried (tests).
    private let hops = Atomic<Int>(0)
    private let carried = Atomic<Int>(0)
    /// Helper blocks sent by work-stealing hops (tests).
    fileprivate let helpers = Atomic<Int>(0)

    /// How many hops the batch has sent (tests).
    var hopCount: Int { hops.load(ordering: .relaxed) }

    /// How many handler invocations those hops carried (tests).
    var carriedCount: Int { carried.load(ordering: .relaxed) }

    /// How many helper blocks hops sent (tests).
    var helperCount: Int { helpers.load(ordering: .relaxed) }

    init() {}

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
    func close() {
        collector.store(0, ordering: .relaxed)
        for group in groups where !group.invocations.isEmpty { send(group) }
        groups.removeAll(keepingCapacity: true)
    }

    /// Collects the invocation `tag` of `target` for `destination`. Call only
    /// when ``isCollectingHere``.
    func add(_ target: some InvocationTarget, tag: UInt64, executor destination: HandlerExecutor) {
        let invocation = Invocation(target: target, tag: tag)
        for index in groups.indices where groups[index].destination.isSame(as: destination) {
            groups[index].invocations.append(invocation)
            if groups[index].invocations.count == Self.handlersPerHop {
                send(groups[index])
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
    private func send(_ group: Group) {
        let invocations = group.invocations
        hops.add(1, ordering: .relaxed)
        carried.add(invocations.count, ordering: .relaxed)
        if invocations.count == 1 {
            let only = invocations[0]
            group.destination.run { only.target.invoke(tag: only.tag) }
            return
        }
        if group.destination.runsOneAtATime {
            group.destination.run {
                for invocation in invocations { invocation.target.invoke(tag: invocation.tag) }
            }
            return
        }
        let hop = DeliveryHop(destination: group.destination, invocations: invocations, batch: self)
        group.destination.run { hop.drain() }
    }
}

/// One hop's handlers on a destination that may run blocks concurrently,
/// claimed one at a time by the hop's block and its helper blocks (see
/// ``DeliveryBatch``).
///
/// At most one helper is on its way at a time: a block that claims a handler
/// while others are unclaimed sends one unless one was sent and has not begun.
/// So a hop of quick handlers costs a few blocks, not one a handler, and every
/// handler that blocks has a block behind it that takes over the rest.
final class DeliveryHop: Sendable {
    private let destination: HandlerExecutor
    private let invocations: [DeliveryBatch.Invocation]
    /// The batch, for its helper count; it lives as long as its engine, which
    /// every primitive in the hop keeps.
    private let batch: DeliveryBatch
    /// The next handler to claim.
    private let cursor = Atomic<Int>(0)
    /// A helper block was sent and has not begun.
    private let helperOnItsWay = Atomic<Bool>(false)

    fileprivate init(destination: HandlerExecutor, invocations: [DeliveryBatch.Invocation], batch: DeliveryBatch) {
        self.destination = destination
        self.invocations = invocations
        self.batch = batch
    }

    /// Claims and runs handlers until none is left, sending a helper before a
    /// handler begins while others wait.
    func drain() {
        while true {
            let index = cursor.add(1, ordering: .relaxed).oldValue
            guard index < invocations.count else { return }
            if index + 1 < invocations.count && !helperOnItsWay.exchange(true, ordering: .relaxed) {
                batch.helpers.add(1, ordering: .relaxed)
                destination.run { [self] in
                    helperOnItsWay.store(false, ordering: .relaxed)
                    drain()
                }
            }
            invocations[index].target.invoke(tag: invocations[index].tag)
        }
    }
}

extension HandlerExecutor {
    /// Whether handlers there run one at a time whatever SafeTimers does (the
    /// main actor, a `SerialExecutor`, the main queue), so that a hop there
    /// runs its handlers in order with no helper. A given queue other than the
    /// main queue may be concurrent: it is not.
    fileprivate var runsOneAtATime: Bool {
        switch self {
        case .mainActor, .serialExecutor: return true
        case .queue, .leasedQueue: return givenQueue.map(MainQueueMarker.isMain) ?? false
        case .globalQueue, .reportQueue, .taskExecutor, .recorder: return false
        }
    }

    /// Whether deliveries to both go to the same place (one batch group); for
    /// watchdog reports with no queue, whether both go to report queues (each
    /// block of the hop makes its own).
    fileprivate func isSame(as other: HandlerExecutor) -> Bool {
        if let mine = givenQueue {
            guard let theirs = other.givenQueue else { return false }
            return mine === theirs || (MainQueueMarker.isMain(mine) && MainQueueMarker.isMain(theirs))
        }
        switch (self, other) {
        case (.globalQueue, .globalQueue), (.reportQueue, .reportQueue), (.mainActor, .mainActor): return true
        case (.serialExecutor(let mine), .serialExecutor(let theirs)): return mine.identity == theirs.identity
        case (.taskExecutor(let mine), .taskExecutor(let theirs)): return mine.identity == theirs.identity
        default: return false
        }
    }
}
