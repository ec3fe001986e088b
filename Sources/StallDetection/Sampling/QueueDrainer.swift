import CStallCapture
import Dispatch

/// Which thread drains a serial dispatch queue now, as libdispatch itself records
/// it: the owner of the queue's drain lock (`stallcapture_queue_drainer`).
///
/// This is how a queue's blocked thread is found whatever the number of threads:
/// one read of the queue object, no look at any other thread, so a worker that
/// ran the stalled job is found among a thousand idle threads as among ten, and a
/// `queue.sync` caller (which runs the block on its own thread) as well.
enum QueueDrainer {
    /// What the queue's drain lock says.
    enum Answer: Equatable {
        /// This thread drains the queue (runs its job, or waits between two).
        case thread(Int32)
        /// No thread drains it: it waits for a thread, is suspended, or is empty.
        case noThread
        /// The drain lock cannot be read here (another libdispatch layout, or not
        /// Linux): the thread must be found another way.
        case unknown
    }

    /// What the drain lock of the serial queue at address `queue` says.
    static func answer(for queue: UInt) -> Answer {
        let owner = stallcapture_queue_drainer(queue)
        switch owner {
        case ..<0: return .unknown
        case 0: return .noThread
        default: return .thread(owner)
        }
    }
}

extension StallDetector.Target {
    /// The address of the serial queue the target owns (the main queue, a
    /// watched queue), known before any probe has run: a queue blocked from the
    /// detector's start (a `queue.sync` right after `start()`) has its drain lock
    /// read all the same. Nil for other targets, or when it cannot be known.
    var ownedQueueAddress: UInt? {
        switch self {
        case .mainQueue: QueueAddress.of(.main)
        case .queue(let queue): QueueAddress.of(queue)
        default: nil
        }
    }

    /// Whether the serial queue the probes run on is the target's own, kept
    /// alive by the detector: the main queue and a watched queue. Only its
    /// drain lock may be read. A `.custom` target's probes may run on a queue
    /// made for one connection and freed since (its memory read as a drain lock
    /// gave thread ids that never existed), or on another queue than the one
    /// that stalls (a `post` that hops through two queues).
    var ownsProbeQueue: Bool {
        switch self {
        case .mainQueue, .queue: true
        case .mainRunLoop, .cooperativePool, .custom: false
        }
    }
}

/// The address of a dispatch queue's C object, as libdispatch's thread-local
/// "current queue" holds it (and as a probe's answer reports it).
enum QueueAddress {
    static func of(_ queue: DispatchQueue) -> UInt? {
        #if canImport(Darwin)
        // A `DispatchQueue` is the `dispatch_queue_t` itself.
        return UInt(bitPattern: Unmanaged.passUnretained(queue).toOpaque())
        #else
        // swift-corelibs-libdispatch wraps the C object in `__wrapped`; read by
        // reflection, so another layout gives nil (the probes' answers say it).
        let wrapped = Mirror(reflecting: queue).children.first { $0.label == "__wrapped" }?.value
        return (wrapped as? OpaquePointer).map { UInt(bitPattern: $0) }
        #endif
    }
}
