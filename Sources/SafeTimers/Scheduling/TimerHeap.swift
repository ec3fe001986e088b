/// A 4-ary min-heap of armed entries, ordered by deadline and then by arming
/// sequence (so equal deadlines come out in the order they were armed).
///
/// Each entry stores its own index (``TimerEntry/heapIndex``), which makes removal
/// of an arbitrary entry O(log n) without a search — the layout Go's runtime uses
/// for its timers. A 4-ary heap is half as deep as a binary one and keeps the four
/// children of a node in one or two cache lines.
///
/// Not thread-safe: ``TimerEngine`` owns one and guards it with its lock.
struct TimerHeap {
    struct Element {
        var deadline: Int64
        var sequence: UInt64
        var entry: any TimerEntry

        @inline(__always)
        func precedes(_ other: Element) -> Bool {
            deadline < other.deadline || (deadline == other.deadline && sequence < other.sequence)
        }
    }

    private(set) var elements: ContiguousArray<Element> = []

    var count: Int { elements.count }
    var isEmpty: Bool { elements.isEmpty }

    /// The earliest element.
    ///
    /// - Complexity: O(1)
    var first: Element? { elements.first }

    /// The earliest deadline after the first element's (among the root's children).
    ///
    /// - Complexity: O(1): at most four comparisons.
    var secondDeadline: Int64? {
        let end = min(elements.count, 5)
        guard end > 1 else { return nil }
        var best = elements[1].deadline
        for index in 2..<end where elements[index].deadline < best { best = elements[index].deadline }
        return best
    }

    /// Inserts `entry`, which must not be in any heap.
    ///
    /// - Complexity: O(log n)
    mutating func insert(_ entry: any TimerEntry, deadline: Int64, sequence: UInt64) {
        elements.append(Element(deadline: deadline, sequence: sequence, entry: entry))
        siftUp(from: elements.count - 1)
    }

    /// Changes the deadline of an entry that is in this heap.
    ///
    /// - Complexity: O(log n)
    mutating func update(at index: Int, deadline: Int64, sequence: UInt64) {
        let moveEarlier = deadline < elements[index].deadline
        elements[index].deadline = deadline
        elements[index].sequence = sequence
        if moveEarlier { siftUp(from: index) } else { siftDown(from: index) }
    }

    /// Removes the element at `index` and marks its entry unarmed.
    ///
    /// - Complexity: O(log n)
    @discardableResult
    mutating func remove(at index: Int) -> Element {
        let last = elements.count - 1
        if index != last {
            elements.swapAt(index, last)
            elements[index].entry.heapIndex = index
        }
        let removed = elements.removeLast()
        removed.entry.heapIndex = -1
        if index < elements.count {
            // The moved element may belong above or below its new place.
            if index > 0 && elements[index].precedes(elements[(index - 1) / 4]) {
                siftUp(from: index)
            } else {
                siftDown(from: index)
            }
        }
        return removed
    }

    /// Removes and returns the earliest element.
    ///
    /// - Complexity: O(log n)
    mutating func removeFirst() -> Element {
        remove(at: 0)
    }

    /// Drops every element (marking each entry unarmed), keeping the capacity.
    mutating func removeAll() {
        for element in elements { element.entry.heapIndex = -1 }
        elements.removeAll(keepingCapacity: true)
    }

    private mutating func siftUp(from start: Int) {
        var child = start
        let moving = elements[child]
        while child > 0 {
            let parent = (child - 1) / 4
            guard moving.precedes(elements[parent]) else { break }
            elements[child] = elements[parent]
            elements[child].entry.heapIndex = child
            child = parent
        }
        elements[child] = moving
        moving.entry.heapIndex = child
    }

    private mutating func siftDown(from start: Int) {
        var parent = start
        let moving = elements[parent]
        let count = elements.count
        while true {
            let firstChild = 4 * parent + 1
            if firstChild >= count { break }
            var best = firstChild
            let end = min(firstChild + 4, count)
            var candidate = firstChild + 1
            while candidate < end {
                if elements[candidate].precedes(elements[best]) { best = candidate }
                candidate += 1
            }
            guard elements[best].precedes(moving) else { break }
            elements[parent] = elements[best]
            elements[parent].entry.heapIndex = parent
            parent = best
        }
        elements[parent] = moving
        moving.entry.heapIndex = parent
    }

    /// Checks the heap order and every stored index; for tests.
    func invariantViolation() -> String? {
        for index in elements.indices {
            if elements[index].entry.heapIndex != index {
                return "entry at \(index) believes it is at \(elements[index].entry.heapIndex)"
            }
            if index > 0 && elements[index].precedes(elements[(index - 1) / 4]) {
                return "element at \(index) precedes its parent"
            }
        }
        return nil
    }
}
