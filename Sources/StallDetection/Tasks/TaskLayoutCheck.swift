import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The check behind ``SwiftTaskLayout/locate()``: run inside the named
/// detached task it makes, it reads that task, an `async let` child and a task
/// group child back by the layout, from their own threads' slots, and passes
/// only when every fact read is the one made.
struct TaskLayoutCheck: Sendable {
    let layout: SwiftTaskLayout

    /// The name of the task group child the check makes.
    static let groupChildName = "SafeTimers.StallDetection task layout check child"
    func run() async -> SwiftTaskLayout.Check {
        let me = SwiftTaskLayout.currentTaskAddress()
        var candidates = Self.slotCandidates(holding: me)
        guard !candidates.isEmpty else { return .failed("the current task's thread-local slot was not found") }
        let chain = read(me)
        guard chain.count == 1, let mine = chain.first, mine.name == SwiftTaskLayout.checkTaskName,
            mine.relation == .topLevel, mine.basePriority == .low
        else { return .failed("a named detached task read back as \(chain)") }
        async let asyncLetSlots = childSlots(parent: me, relation: .asyncLetChild, name: nil, among: candidates)
        candidates = await asyncLetSlots
        let among = candidates
        let groupSlots = await withTaskGroup(of: [Int].self) { group in
            group.addTask(name: Self.groupChildName) {
                await childSlots(parent: me, relation: .taskGroupChild, name: Self.groupChildName, among: among)
            }
            return await group.next() ?? []
        }
        candidates = candidates.filter(groupSlots.contains)
        guard candidates.count == 1, let slot = candidates.first else {
            return .failed("the current task's slot was not told apart (\(candidates.count) candidates)")
        }
        stallcapture_set_task_slot(slot)
        return .verified(layout)
    }

    /// In a child task: the candidate slots that hold it, when it reads back
    /// as a child of `parent` of `relation` named `name`; empty otherwise.
    private func childSlots(
        parent: UInt, relation: StallTask.Relation, name: String?, among candidates: [Int]
    ) async
        -> [Int]
    {
        let me = SwiftTaskLayout.currentTaskAddress()
        let chain = read(me)
        guard chain.count == 2, chain[0].relation == relation, chain[0].name == name,
            chain[1].name == SwiftTaskLayout.checkTaskName,
            TaskRecord.read(at: me, layout: layout, readWord: MemoryBlocks().word(at:))?.parent == parent
        else { return [] }
        return candidates.filter { UInt(stallcapture_tls_word($0)) == me }
    }

    private func read(_ address: UInt) -> [StallTask] {
        TaskRecord.chain(at: address, layout: layout, readWord: MemoryBlocks().word(at:)).tasks
    }

    /// The offsets from this thread's pointer of the words that hold `task`
    /// in the concurrency runtime's own thread-local block.
    private static func slotCandidates(holding task: UInt) -> [Int] {
        var start: UInt = 0
        var size = 0
        guard let runtime = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_task_getCurrent"),
            stallcapture_tls_block_of(UInt(bitPattern: runtime), &start, &size) == 1, size <= 4_096
        else { return [] }
        let first = Int(bitPattern: start) - Int(bitPattern: stallcapture_thread_pointer())
        let wordSize = MemoryLayout<UInt>.size
        return stride(from: first, to: first + size - wordSize + 1, by: wordSize).filter {
            UInt(stallcapture_tls_word($0)) == task
        }
    }
}
