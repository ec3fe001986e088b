import Dispatch

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A thread's counted hold on a queue it gave a primitive, which the primitives
/// it makes for that queue count references to instead of the queue.
///
/// A primitive keeps its handler's queue alive while it lives, and counting a
/// reference to a queue writes the queue's reference count: one cache line that
/// every thread making primitives for that queue shares, so two threads doing
/// so did less work than one. A lease is that thread's own object (the threads
/// share the queue, not the lease), counted by the primitives made on the
/// thread; it holds the queue.
///
/// Each thread keeps leases on the last four queues it gave a primitive (so
/// that alternating between a few queues makes no new lease), until it gives
/// others or ends: a queue is released that much later.
final class QueueLease: Sendable {
    let queue: DispatchQueue
    /// The queue's identity, compared without loading the queue (which would
    /// count a reference to it: the shared write a lease exists to avoid).
    private let identity: UInt

    private init(_ queue: DispatchQueue) {
        self.queue = queue
        identity = UInt(bitPattern: Unmanaged.passUnretained(queue).toOpaque())
    }

    /// How many leases a thread keeps.
    private static let kept = 4

    /// The calling thread's lease on `queue`, made (and kept, in place of the
    /// thread's oldest) when the thread has none. The queue comes unmanaged, so
    /// that finding the lease counts no reference to it.
    @inline(__always)
    static func current(for queue: Unmanaged<DispatchQueue>) -> QueueLease {
        let identity = UInt(bitPattern: queue.toOpaque())
        if let slots = pthread_getspecific(key)?.assumingMemoryBound(to: UInt.self) {
            for index in 0..<kept {
                guard let raw = UnsafeRawPointer(bitPattern: slots[index]) else { break }
                let lease = Unmanaged<QueueLease>.fromOpaque(raw)
                if lease._withUnsafeGuaranteedRef({ $0.identity == identity }) { return lease.takeUnretainedValue() }
            }
        }
        return keepNew(for: queue)
    }

    /// Makes a lease on `queue` and keeps it in the calling thread's slots: the
    /// first free one, else the oldest (slot `kept` holds the next to replace).
    @inline(never)
    private static func keepNew(for queue: Unmanaged<DispatchQueue>) -> QueueLease {
        let lease = QueueLease(queue.takeUnretainedValue())
        let slots: UnsafeMutablePointer<UInt>
        if let existing = pthread_getspecific(key) {
            slots = existing.assumingMemoryBound(to: UInt.self)
        } else {
            slots = .allocate(capacity: kept + 1)
            slots.initialize(repeating: 0, count: kept + 1)
            pthread_setspecific(key, slots)
        }
        let index = (0..<kept).first { slots[$0] == 0 } ?? Int(slots[kept])
        if let previous = UnsafeRawPointer(bitPattern: slots[index]) {
            Unmanaged<QueueLease>.fromOpaque(previous).release()
        }
        slots[index] = UInt(bitPattern: Unmanaged.passRetained(lease).toOpaque())
        slots[kept] = UInt((index + 1) % kept)
        return lease
    }

    /// The thread-specific key of a thread's slots; its destructor releases the
    /// leases and frees the slots when the thread ends.
    private static let slotsKey = LazyThreadKey(destructor: { raw in
        #if canImport(Darwin)
        let slots = raw.assumingMemoryBound(to: UInt.self)
        #else
        guard let slots = raw?.assumingMemoryBound(to: UInt.self) else { return }
        #endif
        for index in 0..<QueueLease.kept {
            if let lease = UnsafeRawPointer(bitPattern: slots[index]) {
                Unmanaged<QueueLease>.fromOpaque(lease).release()
            }
        }
        slots.deallocate()
    })

    @inline(__always)
    private static var key: pthread_key_t { slotsKey.key }
}
