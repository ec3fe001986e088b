import CStallCapture
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One thread's activity labels.
///
/// The owning thread pushes and pops; a detector reads them while the thread is
/// blocked. `depth` is an atomic the owner alone writes (release) and readers load
/// (acquire). A slot below `depth` is written by the owner only when it is about to
/// hold a *different* label, and then under `lock`; readers copy slots under the
/// same lock. So a reader never sees a slot half-written, and never retains a
/// string the owner is releasing; the owner pays for the lock only when a label
/// changes at a depth.
///
/// `@unchecked Sendable` invariant: `slots` is written only by the owning thread,
/// with `lock` held; it is read without the lock only by the owning thread, and by
/// other threads only with `lock` held.
final class ActivityRecord: @unchecked Sendable {
    static let capacity = 32

    let threadID: UInt64
    private let depth = Atomic<Int>(0)
    private let slots: UnsafeMutablePointer<String>
    /// Guards the slots; holds how many times a slot changed (see ``Locked``
    /// on empty values).
    private let lock = Locked(0)

    private init(threadID: UInt64) {
        self.threadID = threadID
        slots = .allocate(capacity: Self.capacity)
        slots.initialize(repeating: "", count: Self.capacity)
    }

    deinit {
        slots.deinitialize(count: Self.capacity)
        slots.deallocate()
    }

    /// The calling thread's record, made on first use; nil while the thread exits.
    @inline(__always)
    static func current() -> Unmanaged<ActivityRecord>? {
        guard let raw = stallcapture_activity_record() else { return register() }
        if raw == exitedMarker { return nil }
        return Unmanaged.fromOpaque(raw)
    }

    /// Pushes `label`; returns the depth to pop back to.
    @inline(__always)
    func push(_ label: String) -> Int {
        let current = depth.load(ordering: .relaxed)
        if current < Self.capacity && slots[current] != label {
            lock.withLock { changes in
                slots[current] = label
                changes &+= 1
            }
        }
        depth.store(current + 1, ordering: .releasing)
        return current
    }

    @inline(__always)
    func pop(to previous: Int) {
        depth.store(previous, ordering: .releasing)
    }

    /// The labels, outermost first, and how many deeper ones were not kept.
    func snapshot() -> (labels: [String], omitted: Int) {
        lock.withLock { _ in
            let count = depth.load(ordering: .acquiring)
            let kept = min(count, Self.capacity)
            return ((0..<kept).map { slots[$0] }, count - kept)
        }
    }

    // MARK: Registry

    /// Marks a thread whose record was removed at its exit.
    private static var exitedMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 1)! }

    /// Every live thread's record, by thread id.
    private static let registry = Locked<[UInt64: ActivityRecord]>([:])

    /// A key whose destructor removes a thread's record when the thread exits.
    private static let exitKey: pthread_key_t? = {
        var key = pthread_key_t()
        #if canImport(Darwin)
        let made = pthread_key_create(&key) { raw in ActivityRecord.threadExits(raw) }
        #else
        let made = pthread_key_create(&key) { raw in
            if let raw { ActivityRecord.threadExits(raw) }
        }
        #endif
        return made == 0 ? key : nil
    }()

    /// The exit key's destructor: the thread's record leaves the registry, and a
    /// later activity on this exiting thread is not recorded.
    private static func threadExits(_ raw: UnsafeMutableRawPointer) {
        let record = Unmanaged<ActivityRecord>.fromOpaque(raw).takeUnretainedValue()
        stallcapture_activity_set_record(exitedMarker)
        registry.withLock { records in
            if records[record.threadID] === record { records[record.threadID] = nil }
        }
    }

    @inline(never)
    private static func register() -> Unmanaged<ActivityRecord>? {
        // Without the exit key a record would outlive its thread and could be
        // mistaken for a later thread with the same id: no activities then.
        guard let key = exitKey else { return nil }
        let record = ActivityRecord(threadID: ThreadIDs.current())
        let unmanaged = Unmanaged.passUnretained(record)
        registry.withLock { $0[record.threadID] = record }
        pthread_setspecific(key, unmanaged.toOpaque())
        stallcapture_activity_set_record(unmanaged.toOpaque())
        return unmanaged
    }

    /// The threads that have a record (tests).
    static var registeredThreads: Set<UInt64> { registry.withLock { Set($0.keys) } }

    /// The labels active on thread `threadID`, outermost first; a last entry
    /// "… N more" when some were nested too deep to keep.
    static func activities(ofThread threadID: UInt64?) -> [String] {
        guard let threadID else { return [] }
        // Under the registry lock, so that the thread's exit cannot remove the
        // record meanwhile (the snapshot itself retains what it copies).
        return registry.withLock { records -> [String] in
            guard let record = records[threadID] else { return [] }
            let (labels, omitted) = record.snapshot()
            return omitted > 0 ? labels + ["… \(omitted) more"] : labels
        }
    }
}
