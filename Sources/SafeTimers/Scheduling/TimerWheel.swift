/// The armed entries of one engine: a hierarchical timing wheel for what is due
/// later, and a small exact heap for what is due in the current granule.
///
/// Time is cut into *granules* of 2^20 ns (about 1.05 ms). The wheel has 8 levels
/// of 64 buckets; a bucket at level L spans 64^L granules, so the levels reach
/// 67 ms, 4.3 s, 4.6 min, 4.9 h, 13 days, 2.3 years and beyond the 292 years that
/// `Int64` nanoseconds can hold. The wheel's position, `wheelTime`, is a granule.
/// Every armed entry is in exactly one of three places:
/// - the **near heap**, when its granule is at or before `wheelTime`: a 4-ary
///   min-heap ordered by deadline, then arming order, so firing is exact;
/// - a **wheel bucket**, when its granule is later: the level is the highest
///   base-64 digit where its granule differs from `wheelTime`, the bucket is that
///   digit of its granule. Buckets are unordered doubly linked lists;
/// - the **parked list**, when its deadline is "never".
///
/// Arming and disarming are O(1) whatever the number of armed entries: a bucket
/// link or unlink, or a heap operation on the near heap, which holds only what is
/// due within about a millisecond. When the wheel's position reaches a bucket,
/// the bucket is emptied and its entries placed again, one level lower or into
/// the near heap ("cascading"): at most 8 moves per entry over its whole life.
///
/// Order is exact: every near-heap deadline is earlier than every wheel
/// deadline, a lower level's buckets come before a higher level's, and a bucket's
/// start is never after its entries' deadlines; so firing the near heap in order
/// and cascading each bucket when its start is reached yields deadline order,
/// ties in arming order. The wheel never has to be stepped through empty
/// buckets: each level's occupied buckets are one 64-bit mask, and the next
/// bucket to cascade is a trailing-zero count away.
///
/// Not thread-safe: each shard of a ``TimerEngine`` owns one and guards it with the shard's lock.
struct TimerWheel: ~Copyable {
    /// A due entry, taken out of the wheel.
    struct Fired {
        var deadline: Int64
        var sequence: UInt64
        var entry: TimerEntry
    }

    private struct NearElement {
        var deadline: Int64
        var sequence: UInt64
        var node: Int32

        @inline(__always)
        func precedes(_ other: NearElement) -> Bool {
            deadline < other.deadline || (deadline == other.deadline && sequence < other.sequence)
        }
    }

    static let granuleShift: Int64 = 20
    private static let levelBits = 6
    private static let levelCount = 8
    private static let bucketsPerLevel = 1 << levelBits
    private static let parkedList = levelCount * bucketsPerLevel

    private var slab = TimerNodeSlab()
    private var near: ContiguousArray<NearElement> = []
    /// Head node of each bucket (level × 64 + slot), then of the parked list;
    /// -1 when empty.
    private let heads: UnsafeMutablePointer<Int32>
    /// One bit per occupied bucket, a word per level.
    private let occupied: UnsafeMutablePointer<UInt64>
    /// Per bucket: no entry in it is due earlier (set when an entry enters an
    /// empty bucket, lowered as entries enter; not raised when entries leave).
    private let bucketMinimum: UnsafeMutablePointer<Int64>
    /// The wheel's position, in granules; moves forward only by cascading.
    private(set) var wheelTime: Int64 = 0
    private var wheelCount = 0
    private var parkedCount = 0

    /// How many entries are armed.
    private(set) var count = 0

    /// Added to a node's number in ``TimerEntry/timerSlot``: the engine's shard
    /// number in the upper 32 bits, so a cancel finds the shard that holds the entry.
    private let slotTag: Int

    init(slotTag: Int = 0) {
        self.slotTag = slotTag
        // On cache lines of their own, so that two shards' wheels, made one
        // after another, never share one.
        heads = Self.allocateLines(Int32.self, count: Self.parkedList + 1)
        heads.initialize(repeating: -1, count: Self.parkedList + 1)
        occupied = Self.allocateLines(UInt64.self, count: Self.levelCount)
        occupied.initialize(repeating: 0, count: Self.levelCount)
        bucketMinimum = Self.allocateLines(Int64.self, count: Self.parkedList)
        bucketMinimum.initialize(repeating: DeadlineArithmetic.never, count: Self.parkedList)
    }

    deinit {
        UnsafeMutableRawPointer(heads).deallocate()
        UnsafeMutableRawPointer(occupied).deallocate()
        UnsafeMutableRawPointer(bucketMinimum).deallocate()
    }

    /// Memory for `count` values, 128-byte aligned and rounded up to 128 bytes.
    private static func allocateLines<T>(_ type: T.Type, count: Int) -> UnsafeMutablePointer<T> {
        let bytes = (MemoryLayout<T>.stride * count + 127) & ~127
        return UnsafeMutableRawPointer.allocate(byteCount: bytes, alignment: 128).bindMemory(
            to: T.self, capacity: count)
    }

    // MARK: Arming and disarming

    /// Arms `entry`, which must not be armed, and records its node in it.
    ///
    /// - Complexity: O(1) (O(log k) for the k entries due in the current granule).
    @inline(__always)
    mutating func insert(_ entry: TimerEntry, deadline: Int64, sequence: UInt64) {
        let index = slab.allocate()
        let node = slab[index]
        node.pointee.deadline = max(deadline, TimerNode.unusedDeadline + 1)
        node.pointee.sequence = sequence
        node.pointee.entry = entry
        entry.timerSlot = slotTag | Int(index)
        place(index, node)
        count += 1
    }

    /// Moves the armed entry in node `index` to a new deadline and sequence.
    ///
    /// - Complexity: as ``insert(_:deadline:sequence:)``.
    mutating func update(node index: Int32, deadline: Int64, sequence: UInt64) {
        let node = slab[index]
        unlink(index, node)
        node.pointee.deadline = max(deadline, TimerNode.unusedDeadline + 1)
        node.pointee.sequence = sequence
        place(index, node)
    }

    /// Puts the entry in node `index` back at `deadline` if it is still the
    /// arming `sequence`, parked at "never" (a manual engine's deferred firing,
    /// see ``TimerEngine/advance(toTicks:)``); nothing if it was armed again since.
    mutating func unpark(node index: Int32, deadline: Int64, sequence: UInt64) {
        let node = slab[index]
        guard node.pointee.deadline == DeadlineArithmetic.never, node.pointee.sequence == sequence else { return }
        update(node: index, deadline: deadline, sequence: sequence)
    }

    /// Disarms the entry in node `index`, marks it unarmed (its
    /// ``TimerEntry/timerSlot`` becomes -1), and hands back the wheel's
    /// reference to it, so that the caller can drop it outside its lock.
    ///
    /// - Complexity: as ``insert(_:deadline:sequence:)``.
    @inline(__always)
    mutating func remove(node index: Int32) -> TimerEntry? {
        let node = slab[index]
        unlink(index, node)
        let entry = node.pointee.entry.take()
        slab.free(index)
        count -= 1
        entry?.timerSlot = -1
        return entry
    }

    /// Disarms everything and hands the entries back (to be released outside the lock).
    mutating func removeAll() -> [TimerEntry] {
        var entries: [TimerEntry] = []
        entries.reserveCapacity(count)
        var used: [Int32] = []
        slab.forEachUsed { index, _ in used.append(index) }
        for index in used {
            if let entry = remove(node: index) { entries.append(entry) }
        }
        return entries
    }

    // MARK: Firing

    /// Takes out the earliest entry if its deadline is at or before `now`,
    /// cascading buckets whose start has been reached on the way.
    mutating func popDue(now: Int64) -> Fired? {
        while true {
            if let top = near.first {
                guard top.deadline <= now else { return nil }
                return Fired(deadline: top.deadline, sequence: top.sequence, entry: remove(node: top.node)!)
            }
            guard let (level, slot, start) = nextBucket(), start <= now else { return nil }
            cascade(level: level, slot: slot, start: start)
        }
    }

    /// The earliest armed deadline: ``DeadlineArithmetic/never`` if only parked
    /// entries remain, nil if none is armed. Cascades as needed, which is always
    /// allowed: the wheel's position may run ahead of the clock.
    mutating func earliestDeadline() -> Int64? {
        while near.isEmpty {
            guard let (level, slot, start) = nextBucket() else {
                return parkedCount > 0 ? DeadlineArithmetic.never : nil
            }
            cascade(level: level, slot: slot, start: start)
        }
        return near[0].deadline
    }

    /// When the scheduler thread must look at the wheel again, in ticks.
    ///
    /// Each bucket keeps a lower bound of its entries' deadlines (exact until an
    /// entry leaves it early, then possibly earlier than any entry left), so the
    /// thread sleeps until the earliest deadline the next bucket may hold, not
    /// until the bucket's start: the bucket is cascaded when the thread wakes,
    /// and the entry fires in the same wake-up. A repeating timer of any period
    /// costs one wake-up per firing. (Waking at bucket starts cost a 50 ms timer
    /// three: at its level-1 bucket, at its level-0 bucket, at its deadline.)
    ///
    /// The earliest entry may fire up to its leeway late, but never past the next
    /// deadline in the near heap nor the next bucket's earliest deadline, so that
    /// entries due in that window share one wake-up and none fires after its own
    /// deadline plus its own leeway.
    func wakeUpTarget() -> Int64 {
        var nextBucketDeadline = DeadlineArithmetic.never
        if let (level, slot, start) = nextBucket() {
            nextBucketDeadline = max(start, bucketMinimum[level << Self.levelBits | slot])
        }
        guard let first = near.first else { return nextBucketDeadline }
        let leeway = slab[first.node].pointee.entry?.leewayTicks ?? 0
        guard leeway > 0 else { return min(first.deadline, nextBucketDeadline) }
        var target = min(DeadlineArithmetic.adding(leeway, to: first.deadline), nextBucketDeadline)
        for index in 1..<min(near.count, 5) { target = min(target, near[index].deadline) }
        return target
    }

    // MARK: Placement

    @inline(__always)
    private mutating func place(_ index: Int32, _ node: UnsafeMutablePointer<TimerNode>) {
        let deadline = node.pointee.deadline
        if deadline == DeadlineArithmetic.never {
            link(index, node, head: heads + Self.parkedList)
            parkedCount += 1
            return
        }
        let granule = deadline >> Self.granuleShift
        if granule <= wheelTime {
            insertNear(NearElement(deadline: deadline, sequence: node.pointee.sequence, node: index))
            return
        }
        let (level, slot) = bucket(ofGranule: granule)
        let bucket = level << Self.levelBits | slot
        bucketMinimum[bucket] = heads[bucket] < 0 ? deadline : min(bucketMinimum[bucket], deadline)
        link(index, node, head: heads + bucket)
        occupied[level] |= 1 << UInt64(slot)
        wheelCount += 1
    }

    /// The level and slot of the bucket that holds a wheel entry due in
    /// `granule` (which is after `wheelTime`): the level is the highest base-64
    /// digit where the two differ, the slot that digit of `granule`.
    @inline(__always)
    private func bucket(ofGranule granule: Int64) -> (level: Int, slot: Int) {
        let difference = UInt64(bitPattern: granule ^ wheelTime)
        let level = (63 - difference.leadingZeroBitCount) / Self.levelBits
        let slot = Int(truncatingIfNeeded: granule >> Int64(level * Self.levelBits)) & (Self.bucketsPerLevel - 1)
        return (level, slot)
    }

    /// Where an armed node is: the parked list (-2), the near heap (-1) or a
    /// bucket (level × 64 + slot). Not stored in the node: it follows from the
    /// deadline and the wheel's position, which only cascading moves, and
    /// cascading places every entry of the bucket it empties again.
    @inline(__always)
    private func location(of node: UnsafeMutablePointer<TimerNode>) -> Int {
        let deadline = node.pointee.deadline
        if deadline == DeadlineArithmetic.never { return -2 }
        let granule = deadline >> Self.granuleShift
        if granule <= wheelTime { return -1 }
        let (level, slot) = bucket(ofGranule: granule)
        return level << Self.levelBits | slot
    }

    @inline(__always)
    private mutating func unlink(_ index: Int32, _ node: UnsafeMutablePointer<TimerNode>) {
        switch location(of: node) {
        case -1:
            removeNear(at: Int(node.pointee.prev))
        case -2:
            unlink(index, node, head: heads + Self.parkedList)
            parkedCount -= 1
        case let bucket:
            unlink(index, node, head: heads + bucket)
            if heads[bucket] < 0 {
                occupied[bucket >> Self.levelBits] &= ~(1 << UInt64(bucket & (Self.bucketsPerLevel - 1)))
            }
            wheelCount -= 1
        }
    }

    @inline(__always)
    private func link(_ index: Int32, _ node: UnsafeMutablePointer<TimerNode>, head: UnsafeMutablePointer<Int32>) {
        node.pointee.prev = -1
        node.pointee.next = head.pointee
        if head.pointee >= 0 { slab[head.pointee].pointee.prev = index }
        head.pointee = index
    }

    @inline(__always)
    private func unlink(_ index: Int32, _ node: UnsafeMutablePointer<TimerNode>, head: UnsafeMutablePointer<Int32>) {
        let next = node.pointee.next
        let prev = node.pointee.prev
        if prev >= 0 { slab[prev].pointee.next = next } else { head.pointee = next }
        if next >= 0 { slab[next].pointee.prev = prev }
    }

    // MARK: Cascading

    /// The bucket to cascade next, and its start in ticks: the lowest occupied
    /// bucket of the lowest occupied level.
    private func nextBucket() -> (level: Int, slot: Int, start: Int64)? {
        guard wheelCount > 0 else { return nil }
        for level in 0..<Self.levelCount where occupied[level] != 0 {
            let slot = occupied[level].trailingZeroBitCount
            return (level, slot, bucketStart(level: level, slot: slot))
        }
        return nil
    }

    /// A bucket's start in ticks: `wheelTime` above its level, its slot at its
    /// level, zeros below.
    private func bucketStart(level: Int, slot: Int) -> Int64 {
        let above = Int64((level + 1) * Self.levelBits)
        let granule = (wheelTime >> above) << above | Int64(slot) << Int64(level * Self.levelBits)
        return granule << Self.granuleShift
    }

    /// Moves the wheel to the bucket's start and places its entries again: each
    /// lands one level lower or more, or in the near heap.
    private mutating func cascade(level: Int, slot: Int, start: Int64) {
        let bucket = level << Self.levelBits | slot
        var index = heads[bucket]
        heads[bucket] = -1
        occupied[level] &= ~(1 << UInt64(slot))
        wheelTime = start >> Self.granuleShift
        while index >= 0 {
            let node = slab[index]
            let next = node.pointee.next
            wheelCount -= 1
            place(index, node)
            index = next
        }
    }

    // MARK: The near heap

    private mutating func insertNear(_ element: NearElement) {
        near.append(element)
        siftUp(element, from: near.count - 1)
    }

    private mutating func removeNear(at position: Int) {
        let last = near.removeLast()
        guard position < near.count else { return }
        // The last element fills the hole; it may belong above or below it.
        if position > 0 && last.precedes(near[(position - 1) / 4]) {
            siftUp(last, from: position)
        } else {
            siftDown(last, from: position)
        }
    }

    private mutating func siftUp(_ moving: NearElement, from start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 4
            guard moving.precedes(near[parent]) else { break }
            near[child] = near[parent]
            slab[near[child].node].pointee.prev = Int32(child)
            child = parent
        }
        near[child] = moving
        slab[moving.node].pointee.prev = Int32(child)
    }

    private mutating func siftDown(_ moving: NearElement, from start: Int) {
        var parent = start
        let count = near.count
        while true {
            let firstChild = 4 * parent + 1
            if firstChild >= count { break }
            var best = firstChild
            for candidate in (firstChild + 1)..<min(firstChild + 4, count) where near[candidate].precedes(near[best]) {
                best = candidate
            }
            guard near[best].precedes(moving) else { break }
            near[parent] = near[best]
            slab[near[parent].node].pointee.prev = Int32(parent)
            parent = best
        }
        near[parent] = moving
        slab[moving.node].pointee.prev = Int32(parent)
    }

    // MARK: Checking

    /// Checks every structural invariant; for tests. Returns the first violation.
    func invariantViolation() -> String? {
        // Where each node actually is, from the lists and the heap; then every
        // node in use must be there, and nowhere else, and that place must be
        // the one its deadline and the wheel's position name.
        var actual: [Int32: Int] = [:]
        for list in 0...Self.parkedList {
            var previous: Int32 = -1
            var index = heads[list]
            if list < Self.parkedList {
                let marked = occupied[list >> Self.levelBits] & (1 << UInt64(list & (Self.bucketsPerLevel - 1))) != 0
                if marked != (index >= 0) {
                    return
                        "bucket \(list >> Self.levelBits)/\(list & 63) is marked \(marked ? "occupied" : "empty") but is not"
                }
            }
            while index >= 0 {
                if actual[index] != nil { return "node \(index) is linked twice" }
                actual[index] = list == Self.parkedList ? -2 : list
                if slab[index].pointee.prev != previous { return "node \(index) has a wrong previous link" }
                previous = index
                index = slab[index].pointee.next
            }
        }
        for (position, element) in near.enumerated() {
            if actual[element.node] != nil { return "node \(element.node) is in the near heap and a list" }
            actual[element.node] = -1
            if slab[element.node].pointee.prev != Int32(position) {
                return "node \(element.node) has a wrong near-heap position \(slab[element.node].pointee.prev)"
            }
        }
        var seen = 0
        var problem: String? = nil
        slab.forEachUsed { index, node in
            guard problem == nil else { return }
            seen += 1
            let value = node.pointee
            guard let entry = value.entry else {
                problem = "node \(index) is in use without an entry"
                return
            }
            if entry.timerSlot != slotTag | Int(index) {
                problem = "entry in node \(index) believes it is in node \(entry.timerSlot)"
            }
            guard let place = actual[index] else {
                problem = "node \(index) is in use but in no list and not in the near heap"
                return
            }
            let expected = location(of: node)
            if place != expected {
                problem = "node \(index) is in place \(place), but its deadline belongs in \(expected)"
            }
        }
        if let problem { return problem }
        if seen != count { return "\(seen) nodes in use, count says \(count)" }
        for position in near.indices where position > 0 && near[position].precedes(near[(position - 1) / 4]) {
            return "near-heap element \(position) precedes its parent"
        }
        return nil
    }
}
