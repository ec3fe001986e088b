import CStallCapture
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import StallDetection

@Suite("Reading Swift tasks from the runtime's memory")
struct TaskRecordTests {
    /// Waits for the process's layout check (started here if no detector did).
    static func checkedLayout() async throws -> SwiftTaskLayout {
        SwiftTaskLayout.locate()
        for _ in 0..<1_000 {
            switch SwiftTaskLayout.state {
            case .verified(let layout): return layout
            case .failed(let reason): throw CheckFailed(reason: reason)
            case .notStarted, .underWay: try await Task.sleep(for: .milliseconds(10))
            }
        }
        throw CheckFailed(reason: "the check did not finish in 10 s")
    }

    struct CheckFailed: Error { let reason: String }

    /// A made-up process memory of tasks laid out as Swift 6.3 lays them out.
    struct Memory {
        static let layout = SwiftTaskLayout(taskMetadata: 0x7F00_0000_1000, taskSize: 0xD0)
        var words: [UInt: UInt] = [:]

        /// Writes a task at `address`.
        mutating func task(
            at address: UInt, flags: SwiftTaskLayout.Flags, id: UInt32, priority: UInt8, base: UInt8,
            records: UInt = 0, parent: UInt? = nil
        ) {
            words[address] = Self.layout.taskMetadata
            words[address + SwiftTaskLayout.flagsOffset] = UInt(flags.rawValue) | UInt(id) << 32
            words[address + SwiftTaskLayout.statusOffset] = UInt(priority)
            words[address + SwiftTaskLayout.statusOffset + SwiftTaskLayout.statusRecordOffset] = records
            words[address + SwiftTaskLayout.basePriorityOffset] = UInt(base)
            if let parent { words[address + Self.layout.taskSize] = parent }
        }

        /// Writes a status record of `kind` at `address`, linked to `older`.
        mutating func record(at address: UInt, kind: UInt8, older: UInt, name: UInt = 0) {
            words[address] = UInt(kind)
            words[address + SwiftTaskLayout.recordParentOffset] = older
            words[address + SwiftTaskLayout.nameRecordNameOffset] = name
        }

        /// Writes `bytes` at `address` (word-aligned), zero-padded to whole words.
        mutating func bytes(_ bytes: [UInt8], at address: UInt) {
            let padded = bytes + [UInt8](repeating: 0, count: (8 - bytes.count % 8) % 8)
            for start in stride(from: 0, to: padded.count, by: 8) {
                words[address + UInt(start)] = padded[start..<(start + 8)].enumerated().reduce(0) {
                    $0 | UInt($1.element) << UInt(8 * $1.offset)
                }
            }
        }

        func chain(at address: UInt) -> (tasks: [StallTask], cut: String?) {
            TaskRecord.chain(at: address, layout: Self.layout, readWord: { words[$0] })
        }
    }

    static let parent: UInt = 0x5000_0000
    static let child: UInt = 0x6000_0000
    static let nameRecord: UInt = 0x7000_0000
    static let otherRecord: UInt = 0x7000_0100
    static let name: UInt = 0x7100_0000

    /// A group child (escalated from medium to high) of a task named "GET /feed".
    static func family() -> Memory {
        var memory = Memory()
        memory.bytes(Array("GET /feed".utf8) + [0], at: name)
        memory.record(at: nameRecord, kind: SwiftTaskLayout.nameRecordKind, older: 0, name: name)
        // A newer record of another kind (a child's) in front of the name's.
        memory.record(at: otherRecord, kind: 1, older: nameRecord)
        memory.task(at: parent, flags: [.hasName], id: 3, priority: 25, base: 25, records: otherRecord)
        memory.task(at: child, flags: [.isChild, .isGroupChild], id: 9, priority: 25, base: 21, parent: parent)
        return memory
    }

    @Test("a group child and its named parent: relation, ids, priorities and name, innermost first")
    func family() {
        let (tasks, cut) = Self.family().chain(at: Self.child)
        #expect(cut == nil)
        #expect(
            tasks == [
                StallTask(id: 9, name: nil, priority: .high, basePriority: .medium, relation: .taskGroupChild),
                StallTask(id: 3, name: "GET /feed", priority: .high, basePriority: .high, relation: .topLevel),
            ])
        #expect(
            tasks.map(\.description) == [
                "unnamed (id 9, high priority (escalated from medium), child task of a task group)",
                "\"GET /feed\" (id 3, high priority, top-level task)",
            ])
    }

    @Test("an async let child, and a child of no known kind")
    func relations() {
        var memory = Self.family()
        memory.task(at: Self.child, flags: [.isChild, .isAsyncLet], id: 9, priority: 21, base: 21, parent: Self.parent)
        #expect(memory.chain(at: Self.child).tasks.first?.relation == .asyncLetChild)
        memory.task(at: Self.child, flags: [.isChild], id: 9, priority: 21, base: 21, parent: Self.parent)
        #expect(memory.chain(at: Self.child).tasks.first?.relation == .child)
    }

    @Test("what is no task is refused: another object's metadata, a job of another kind, a misaligned or null address")
    func notATask() {
        var memory = Self.family()
        #expect(memory.chain(at: Self.child + 8).tasks.isEmpty)
        #expect(memory.chain(at: 0).tasks.isEmpty)
        #expect(memory.chain(at: 0x1234_0000).tasks.isEmpty, "unreadable")
        memory.words[Self.child] = 0x7F00_0000_2000
        #expect(memory.chain(at: Self.child) == ([], nil))
        memory = Self.family()
        memory.task(at: Self.child, flags: SwiftTaskLayout.Flags(rawValue: 2), id: 9, priority: 21, base: 21)
        #expect(memory.chain(at: Self.child).tasks.isEmpty, "a job of kind 2")
    }

    @Test("a parent that cannot be read (freed meanwhile) ends the chain, and says so")
    func freedParent() {
        var memory = Self.family()
        memory.words[Self.parent] = 0xDEAD_BEEF
        let (tasks, cut) = memory.chain(at: Self.child)
        #expect(tasks.count == 1 && tasks.first?.id == 9)
        #expect(cut == "the parent task at 0x50000000 could not be read")
    }

    @Test("a task that is its own parent (garbage) stops after 32 parents")
    func cycle() {
        var memory = Memory()
        memory.task(at: Self.child, flags: [.isChild], id: 9, priority: 21, base: 21, parent: Self.child)
        let (tasks, cut) = memory.chain(at: Self.child)
        #expect(tasks.count == TaskRecord.parentLimit + 1)
        #expect(cut == "more than 32 parent tasks")
    }

    @Test(
        "a name that is unterminated, not UTF-8 or unreadable, or a record list that loops: no name, the task still read",
        arguments: 0..<4)
    func badNames(kind: Int) {
        var memory = Self.family()
        switch kind {
        case 0: memory.bytes([UInt8](repeating: 0x41, count: 300), at: Self.name)
        case 1: memory.bytes([0x47, 0xFF, 0xFE, 0], at: Self.name)
        case 2: memory.record(at: Self.nameRecord, kind: SwiftTaskLayout.nameRecordKind, older: 0, name: 0x1234_0000)
        default: memory.record(at: Self.otherRecord, kind: 1, older: Self.otherRecord)
        }
        let (tasks, _) = memory.chain(at: Self.child)
        #expect(tasks.count == 2 && tasks[1].id == 3 && tasks[1].name == nil)
    }

    @Test("a name of 255 bytes is read whole; one of 256 is not read")
    func nameLength() {
        var memory = Self.family()
        memory.bytes([UInt8](repeating: 0x62, count: 255) + [0], at: Self.name)
        #expect(memory.chain(at: Self.parent).tasks.first?.name?.utf8.count == 255)
        memory.bytes([UInt8](repeating: 0x62, count: 256) + [0], at: Self.name)
        #expect(memory.chain(at: Self.parent).tasks.first?.name == nil)
    }

    // MARK: This process's runtime

    @Test("the layout check passes on this toolchain's runtime", .enabled(if: SamplingSupport.isAvailable))
    func layoutVerified() async throws {
        _ = try await Self.checkedLayout()
    }

    /// This task and its parents, read from memory as a report reads them.
    static func current(_ layout: SwiftTaskLayout) -> [StallTask] {
        TaskRecord.chain(at: SwiftTaskLayout.currentTaskAddress(), layout: layout, readWord: MemoryBlocks().word(at:))
            .tasks
    }

    @Test("tasks of this process read back as made: names, priorities, group and async let children")
    func thisProcess() async throws {
        guard SamplingSupport.isAvailable else { return }
        let layout = try await Self.checkedLayout()
        let outer = await Task.detached(name: "outer ✓", priority: .high) { Self.current(layout) }.value
        #expect(outer.count == 1 && outer.first?.name == "outer ✓" && outer.first?.relation == .topLevel)
        #expect(outer.first?.basePriority == .high)
        let nested = await Task.detached(name: "request", priority: .low) { () async -> [[StallTask]] in
            async let child = Self.current(layout)
            let fromGroup = await withTaskGroup(of: [StallTask].self) { group in
                group.addTask(name: "member") { Self.current(layout) }
                return await group.next() ?? []
            }
            return [await child, fromGroup]
        }.value
        #expect(nested[0].map(\.relation) == [.asyncLetChild, .topLevel])
        #expect(nested[0].map(\.name) == [nil, "request"])
        #expect(nested[1].map(\.relation) == [.taskGroupChild, .topLevel])
        #expect(nested[1].map(\.name) == ["member", "request"])
        #expect(nested[1].first?.basePriority == .low)
    }

    /// An actor whose executor is a serial dispatch queue.
    final class QueueExecutor: SerialExecutor {
        let queue = DispatchQueue(label: "TaskRecordTests.actor")
        func enqueue(_ job: consuming ExecutorJob) {
            let job = UnownedJob(job)
            let executor = asUnownedSerialExecutor()
            queue.async { job.runSynchronously(on: executor) }
        }
    }

    actor Blocker {
        let executor = QueueExecutor()
        nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

        /// Blocks its queue for `milliseconds`, spinning or asleep.
        func block(milliseconds: Int, spinning: Bool) {
            let end = ContinuousClock.now + .milliseconds(milliseconds)
            while ContinuousClock.now < end {
                if !spinning { usleep(5_000) }
            }
        }
    }

    @Test(
        "a stall in a named task's group child on an actor names both tasks, sampled running (signal) or asleep (/proc)",
        .enabled(if: SamplingSupport.isAvailable),
        .disabled(if: underThreadSanitizer, "real-time bounds do not hold under ThreadSanitizer"),
        arguments: [true, false])
    func stallNamesItsTask(spinning: Bool) async throws {
        _ = try await Self.checkedLayout()
        let blocker = Blocker()
        let events = Mutex<[StallEvent]>([])
        let detector = StallDetector(
            target: .queue(blocker.executor.queue), threshold: .milliseconds(200),
            onEvent: { event in events.withLock { $0.append(event) } })
        detector.start()
        try await Task.sleep(for: .milliseconds(100))
        await Task.detached(name: "GET /slow", priority: .medium) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask(name: "render") { await blocker.block(milliseconds: 700, spinning: spinning) }
            }
        }.value
        // The first stall of a debug test process is named slowly (its symbols
        // are read then): its events may come after the block.
        let blockerStalls = { (all: [StallEvent]) in
            all.filter {
                $0.phase == .started && $0.backtrace.frames.contains { $0.function?.contains("Blocker.block") == true }
            }
        }
        await waitUntil {
            events.withLock { all in
                blockerStalls(all).contains { started in all.contains { $0.phase == .ended && $0.id == started.id } }
            }
        }
        detector.stop()
        // No other stall: an idle queue whose answer waited for a core (on
        // whichever worker) is none; nor is the blocker's stall without its stack.
        let all = events.withLock { $0 }
        let started = blockerStalls(all)
        #expect(
            all.filter { $0.phase == .started }.count == started.count,
            "a stall that does not name the blocker (a false one, or the blocker's without its stack): \(all)")
        try #require(started.count == 1, "\(all)")
        let backtrace = started[0].backtrace
        #expect(backtrace.task?.name == "render" && backtrace.task?.relation == .taskGroupChild, "\(backtrace)")
        #expect(backtrace.parentTasks.map(\.name) == ["GET /slow"] && backtrace.parentTasksCut == nil)
        #expect(backtrace.description.contains("task: \"render\" (id "), "\(backtrace)")
    }
}
