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
    /// What the runtime exports for debuggers (``SwiftTaskLayout/exportedFacts()``).
    let exported: (found: Bool, layout: SwiftTaskLayout?)

    /// The name of the task group child the check makes.
    static let groupChildName = "SafeTimers.StallDetection task layout check child"

    func run() async -> SwiftTaskLayout.Check {
        let me = SwiftTaskLayout.currentTaskAddress()
        if exported.found && exported.layout == nil { return .failed("the runtime's task layout version is not 1") }
        // A task's first word is its metadata: read from this task where the
        // runtime does not export it, and checked on the children below.
        guard let metadata = MemoryBlocks().word(at: me), metadata != 0,
            exported.layout.map({ $0.taskMetadata == metadata }) ?? true
        else { return .failed("this task's metadata is not the runtime's task metadata") }
        let layout = SwiftTaskLayout(
            taskMetadata: metadata, taskSize: exported.layout?.taskSize ?? SwiftTaskLayout.defaultTaskSize)
        return await run(me: me, layout: layout)
    }

    private func run(me: UInt, layout: SwiftTaskLayout) async -> SwiftTaskLayout.Check {
        var candidates = Self.slotCandidates(holding: me)
        guard !candidates.isEmpty else { return .failed("the current task's thread-local slot was not found") }
        let chain = read(me, layout)
        guard chain.count == 1, let mine = chain.first, mine.name == SwiftTaskLayout.checkTaskName,
            mine.relation == .topLevel, mine.basePriority == .low
        else { return .failed("a named detached task read back as \(chain)") }
        async let asyncLetSlots = childSlots(
            parent: me, relation: .asyncLetChild, name: nil, among: candidates, layout: layout)
        candidates = await asyncLetSlots
        let among = candidates
        let groupSlots = await withTaskGroup(of: [Int].self) { group in
            group.addTask(name: Self.groupChildName) {
                await childSlots(
                    parent: me, relation: .taskGroupChild, name: Self.groupChildName, among: among, layout: layout)
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
        parent: UInt, relation: StallTask.Relation, name: String?, among candidates: [Int], layout: SwiftTaskLayout
    ) async -> [Int] {
        let me = SwiftTaskLayout.currentTaskAddress()
        let chain = read(me, layout)
        guard chain.count == 2, chain[0].relation == relation, chain[0].name == name,
            chain[1].name == SwiftTaskLayout.checkTaskName,
            TaskRecord.read(at: me, layout: layout, readWord: MemoryBlocks().word(at:))?.parent == parent
        else { return [] }
        return candidates.filter { UInt(stallcapture_tls_word($0)) == me }
    }

    private func read(_ address: UInt, _ layout: SwiftTaskLayout) -> [StallTask] {
        TaskRecord.chain(at: address, layout: layout, readWord: MemoryBlocks().word(at:)).tasks
    }

    /// The offsets from this thread's pointer of the words that hold `task`
    /// in the thread-local block of the image holding the concurrency runtime
    /// (its library's own, or the executable's when it is linked statically).
    private static func slotCandidates(holding task: UInt) -> [Int] {
        var start: UInt = 0
        var size = 0
        guard let runtime = RuntimeImage.address(of: "swift_task_getCurrent"),
            stallcapture_tls_block_of(runtime, &start, &size) == 1, size <= 1 << 20
        else { return [] }
        let wordSize = MemoryLayout<UInt>.size
        var words = [UInt](repeating: 0, count: size / wordSize)
        let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: start, into: $0) }
        let first = Int(bitPattern: start) - Int(bitPattern: stallcapture_thread_pointer())
        return words.prefix(copied).indices.filter { words[$0] == task }.map { first + $0 * wordSize }
    }
}
