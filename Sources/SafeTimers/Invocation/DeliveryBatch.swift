import Dispatch
import Synchronization

/// The handler deliveries a real-time engine's scheduler thread collects while
/// it fires one round of due entries, so that firings due together for the
/// same destination reach it in one hop instead of one each.
///
/// A hop carries at most ``handlersPerHop`` handlers, run one after another in
/// deadline order; a destination's hop leaves as soon as it is full, and the
/// rest when the round ends. So:
/// - on a serial queue, handlers run in the order they would have run with a
///   hop each (hops are enqueued in deadline order);
/// - on a concurrent queue (the global queue, the default), a burst of firings
///   still spreads over the queue's threads, in groups of up to 16; a handler
///   that blocks delays at most the 15 that follow it in its group;
/// - a round with one firing per destination (the usual case) makes one hop
///   each, exactly as without batching.
///
/// Deliveries made by any other thread (a `Throttler` call, a `start()`), and
/// all deliveries of a manual engine, go out at once as before.
///
/// `@unchecked Sendable` invariant: `groups` is read and written only by the
/// thread whose number `collector` holds (the scheduler thread, between
/// ``open()`` and ``close()``); `collector` is atomic.
final class DeliveryBatch: @unchecked Sendable {
    /// The most handlers one hop runs.
    static let handlersPerHop = 16

    /// Where a group's handlers run.
    private enum Destination {
        case queue(DispatchQueue)
        case globalQueue
        case mainActor

        func isSame(as other: Destination) -> Bool {
            switch (self, other) {
            case (.queue(let mine), .queue(let theirs)): return mine === theirs
            case (.globalQueue, .globalQueue), (.mainActor, .mainActor): return true
            default: return false
            }
        }
    }

    private struct Invocation {
        let target: any InvocationTarget
        let tag: UInt64
    }

    private struct Group {
        let destination: Destination
        var invocations: [Invocation]
    }

    /// The collecting thread's ``ThreadIdentity/current()`` number; 0 when no
    /// round is open.
    private let collector = Atomic<UInt>(0)
    private var groups: [Group] = []
    /// Hops sent, and handlers they carried (tests).
    private let hops = Atomic<Int>(0)
    private let carried = Atomic<Int>(0)

    /// How many hops the batch has sent (tests).
    var hopCount: Int { hops.load(ordering: .relaxed) }

    /// How many handler invocations those hops carried (tests).
    var carriedCount: Int { carried.load(ordering: .relaxed) }

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

    /// Collects the invocation `tag` of `target` for `executor` (which is not a
    /// test recorder). Call only when ``isCollectingHere``.
    func add(_ target: some InvocationTarget, tag: UInt64, executor: HandlerExecutor) {
        let destination: Destination
        switch executor {
        case .queue(let queue): destination = .queue(queue)
        case .globalQueue: destination = .globalQueue
        case .mainActor: destination = .mainActor
        case .recorder(let recorder):
            recorder.record(target, tag: tag)
            return
        }
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
            switch group.destination {
            case .queue(let queue): queue.async { only.target.invoke(tag: only.tag) }
            case .globalQueue: DispatchQueue.global().async { only.target.invoke(tag: only.tag) }
            case .mainActor: Task { @MainActor in only.target.invoke(tag: only.tag) }
            }
            return
        }
        switch group.destination {
        case .queue(let queue): queue.async { for each in invocations { each.target.invoke(tag: each.tag) } }
        case .globalQueue:
            DispatchQueue.global().async { for each in invocations { each.target.invoke(tag: each.tag) } }
        case .mainActor: Task { @MainActor in for each in invocations { each.target.invoke(tag: each.tag) } }
        }
    }
}
