/// Where the engine keeps what it knows about one armed entry: 32 bytes, two to
/// a cache line (every pending timer has one).
///
/// A node never moves while its entry is armed: the entry stores the node's
/// number (``TimerEntry/timerSlot``), so disarming goes straight to it. Where the
/// node is (near heap, a bucket, the parked list) is not stored: it follows from
/// its deadline and the wheel's position (see ``TimerWheel``).
struct TimerNode {
    /// The deadline in ticks; ``unusedDeadline`` while the node is free.
    var deadline: Int64 = TimerNode.unusedDeadline
    /// The arming's sequence number: orders equal deadlines, and tells an entry
    /// whether a firing belongs to its current arming.
    var sequence: UInt64 = 0
    /// In a wheel bucket or the parked list: the next node (-1 at the end).
    /// In the free list: the next free node.
    var next: Int32 = -1
    /// In a wheel bucket or the parked list: the previous node (-1 at the head).
    /// In the near heap: the node's position there.
    var prev: Int32 = -1
    /// The armed entry, counted: the engine keeps it alive while it is armed.
    var entry: TimerEntry? = nil

    /// The deadline of a free node, which no arming has (the wheel raises an
    /// armed deadline of `Int64.min` by one tick).
    static let unusedDeadline = Int64.min
}

/// Stable storage for ``TimerNode``s, in chunks that are never moved or freed
/// while the slab lives, with a free list: arming takes a node, disarming gives
/// it back, and neither allocates once the slab has grown to the peak number of
/// armed entries.
///
/// Chunks hold 512 nodes (16 KiB), so growing never copies what exists. When the
/// last node is given back, every chunk but the first is freed, so a burst of
/// timers leaves nothing behind once it is over.
///
/// Not thread-safe: ``TimerWheel`` owns one, under its shard's lock.
struct TimerNodeSlab: ~Copyable {
    private static let chunkShift = 9
    private static let chunkSize = 1 << chunkShift

    private var chunks: [UnsafeMutablePointer<TimerNode>] = []
    private var freeHead: Int32 = -1
    private var inUse = 0

    init() {}

    deinit {
        for chunk in chunks {
            chunk.deinitialize(count: Self.chunkSize)
            chunk.deallocate()
        }
    }

    /// The node numbered `index`.
    @inline(__always)
    subscript(index: Int32) -> UnsafeMutablePointer<TimerNode> {
        let index = Int(index)
        return chunks[index &>> Self.chunkShift] + (index & (Self.chunkSize - 1))
    }

    /// Takes a free node (growing by one chunk if none is free).
    @inline(__always)
    mutating func allocate() -> Int32 {
        if freeHead < 0 { grow() }
        let index = freeHead
        freeHead = self[index].pointee.next
        inUse += 1
        return index
    }

    /// Gives `index` back. Its entry must already have been taken out.
    @inline(__always)
    mutating func free(_ index: Int32) {
        let node = self[index]
        node.pointee.deadline = TimerNode.unusedDeadline
        node.pointee.next = freeHead
        freeHead = index
        inUse -= 1
        if _slowPath(inUse == 0 && chunks.count > 1) { shrink() }
    }

    /// Frees every chunk but the first (all nodes are free) and rebuilds the free list.
    private mutating func shrink() {
        for chunk in chunks.dropFirst() {
            chunk.deinitialize(count: Self.chunkSize)
            chunk.deallocate()
        }
        chunks.removeSubrange(1...)
        let first = chunks[0]
        for offset in 0..<Self.chunkSize {
            first[offset].next = offset + 1 < Self.chunkSize ? Int32(offset + 1) : -1
        }
        freeHead = 0
    }

    /// Every node in use, for draining and for invariant checks.
    func forEachUsed(_ body: (Int32, UnsafeMutablePointer<TimerNode>) -> Void) {
        for (chunkNumber, chunk) in chunks.enumerated() {
            for offset in 0..<Self.chunkSize where chunk[offset].deadline != TimerNode.unusedDeadline {
                body(Int32(chunkNumber << Self.chunkShift + offset), chunk + offset)
            }
        }
    }

    private mutating func grow() {
        precondition(chunks.count < (Int(Int32.max) >> Self.chunkShift), "more than 2^31 armed timers")
        let chunk = UnsafeMutablePointer<TimerNode>.allocate(capacity: Self.chunkSize)
        chunk.initialize(repeating: TimerNode(), count: Self.chunkSize)
        let base = Int32(chunks.count << Self.chunkShift)
        chunks.append(chunk)
        // Thread the new nodes onto the free list, lowest number first.
        for offset in 0..<Self.chunkSize {
            chunk[offset].next = offset + 1 < Self.chunkSize ? base + Int32(offset + 1) : freeHead
        }
        freeHead = base
    }
}
