import Dispatch

/// A primitive whose handler invocations an executor runs.
protocol InvocationTarget: AnyObject, Sendable {
    /// Runs the invocation queued as `tag` on the current thread, if the
    /// primitive's ``InvocationGate`` still admits it: begin (lock held), the
    /// handler (no lock), end (lock held).
    func invoke(tag: UInt64)
}

/// Where a primitive runs its user handler: a `DispatchQueue`, the main actor, a
/// Swift executor, or (in tests) a recorder that lets the test decide when each delivery begins.
enum HandlerExecutor: Sendable {
    case queue(DispatchQueue)
    /// A queue, held through the lease of the thread that made the primitive
    /// (see ``QueueLease``): what ``on(_:)`` gives for a queue.
    case leasedQueue(QueueLease)
    /// The default-QoS global queue, looked up when a handler is delivered: on
    /// Linux each `DispatchQueue.global()` allocates a wrapper object, which a
    /// primitive would otherwise allocate when it is made and keep while it lives.
    case globalQueue
    /// A new serial queue for each block (a delivery, or a batch's hop and each
    /// of its helpers): a watchdog's default. On Linux the
    /// global queue adds a thread about once a second while its threads are
    /// blocked, so a report sent there waits behind blocked work, the very hang
    /// a watchdog is there to report; a serial queue of its own gets a thread at once.
    case reportQueue
    case mainActor
    /// A `SerialExecutor` (an event loop's, an actor's), through an actor of it.
    case serialExecutor(SerialExecutorActor)
    /// A `TaskExecutor`, or another kind of executor through a forwarding one.
    case taskExecutor(TaskExecutorDestination)
    /// Tests only, on a manual engine: deliveries are recorded, and the test
    /// runs them when it likes.
    case recorder(DeliveryRecorder)

    /// Runs `body` where this executor's handlers run: on the queue, or on the
    /// main actor through a task, which works under a run loop, `dispatchMain()`
    /// and an async `main` alike. (A recorder runs nothing: a manual engine
    /// records deliveries to it in ``TimerEngine/deliver(_:tag:to:)``; a
    /// real-time engine never gets one.)
    /// Which thread hands it over, and when, is the engine's to decide
    /// (``TimerEngine/deliver(_:tag:to:)``).
    @inline(__always)
    func run(_ body: @escaping @Sendable () -> Void) {
        switch self {
        case .queue(let queue): queue.async(execute: body)
        case .leasedQueue(let lease): lease.queue.async(execute: body)
        case .globalQueue: DispatchQueue.global().async(execute: body)
        case .reportQueue: HandlerExecutor.newReportQueue().async(execute: body)
        case .mainActor: Task { @MainActor in body() }
        case .serialExecutor(let actor): actor.startTask(running: body)
        case .taskExecutor(let destination): destination.run(body)
        case .recorder: preconditionFailure("a recorder's deliveries are recorded, not run")
        }
    }

    /// `queue` (leased), or the global queue when it is nil.
    @inline(__always)
    static func on(_ queue: DispatchQueue?) -> HandlerExecutor {
        // The queue's address, read without counting a reference to it (binding
        // the optional counted one around the lease lookup: a write to the one
        // cache line every thread using this queue shares).
        guard let address = UnsafeRawPointer(bitPattern: unsafeBitCast(queue, to: UInt.self)) else {
            return .globalQueue
        }
        return .leasedQueue(QueueLease.current(for: Unmanaged<DispatchQueue>.fromOpaque(address)))
    }

    /// `queue` (leased), or a new serial queue for each delivery when it is
    /// nil: where a watchdog reports.
    @inline(__always)
    static func forReports(on queue: DispatchQueue?) -> HandlerExecutor {
        queue == nil ? .reportQueue : .on(queue)
    }

    /// The queue of one watchdog report when none was given (see ``reportQueue``).
    static func newReportQueue() -> DispatchQueue {
        DispatchQueue(label: "SafeTimers.Watchdog.onTimeout")
    }

    /// `executor`: a `SerialExecutor` through an actor of it, a `TaskExecutor`
    /// as it is, another kind through a ``JobForwardingExecutor``.
    static func onExecutor(_ executor: any Executor) -> HandlerExecutor {
        if let serial = executor as? any SerialExecutor {
            return .serialExecutor(SerialExecutorActor(serial))
        }
        let task = (executor as? any TaskExecutor) ?? JobForwardingExecutor(executor)
        return .taskExecutor(TaskExecutorDestination(task, identity: ObjectIdentifier(executor)))
    }

    /// The dispatch queue handlers go to, when it is a given one.
    var givenQueue: DispatchQueue? {
        switch self {
        case .queue(let queue): return queue
        case .leasedQueue(let lease): return lease.queue
        case .globalQueue, .reportQueue, .mainActor, .serialExecutor, .taskExecutor, .recorder: return nil
        }
    }

    /// Wraps a main-actor handler so that it can be stored as a plain one: the
    /// executor runs it only on the main actor.
    static func adapt(_ handler: @escaping @MainActor @Sendable () -> Void) -> @Sendable () -> Void {
        { MainActor.assumeIsolated { handler() } }
    }
}

/// Tells whether the current code runs as a block of the main dispatch queue,
/// which is where the main actor's jobs run. Under `dispatchMain()` on Linux the
/// main thread exits and a worker thread drains the main queue, so "is this the
/// main thread" is not the question to ask.
enum MainQueueMarker {
    private static let key = DispatchSpecificKey<Bool>()
    private static let installed: Bool = {
        DispatchQueue.main.setSpecific(key: key, value: true)
        return true
    }()

    static var isCurrent: Bool {
        _ = installed
        return DispatchQueue.getSpecific(key: key) ?? false
    }

    /// Whether `queue` is the main queue. On Linux every `DispatchQueue.main` is
    /// a new wrapper object, so `queue === .main` says no for the main queue
    /// reached another time; the marker is set on the queue itself.
    static func isMain(_ queue: DispatchQueue) -> Bool {
        _ = installed
        return queue.getSpecific(key: key) ?? false
    }
}

/// Tests only: the deliveries made to a ``HandlerExecutor/recorder(_:)`` executor,
/// in order, so that an interleaving explorer decides when each one begins.
final class DeliveryRecorder: Sendable {
    struct Delivery: Sendable {
        let target: any InvocationTarget
        let tag: UInt64
    }

    private let deliveries = StateLock<[Delivery]>([])

    init() {}

    func record(_ target: any InvocationTarget, tag: UInt64) {
        deliveries.withLock { $0.append(Delivery(target: target, tag: tag)) }
    }

    /// Takes every delivery recorded so far.
    func takeAll() -> [Delivery] {
        deliveries.withLock { deliveries in
            let taken = deliveries
            deliveries = []
            return taken
        }
    }
}
