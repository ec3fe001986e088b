/// Reads a Swift task from the concurrency runtime's memory: its flags, id,
/// priorities, name and parent, by the layout ``SwiftTaskLayout`` holds.
///
/// Every read goes through `readWord` (``MemoryBlocks``, which cannot fault):
/// a task that completed and was freed meanwhile reads as garbage, and garbage
/// is refused (the task's first word must be the runtime's task metadata), not
/// shown.
struct TaskRecord: Sendable, Equatable {
    /// The task as a report shows it.
    var task: StallTask
    /// The parent task's address (a child task's), or nil.
    var parent: UInt?

    /// The most parents followed, and the most status records searched for
    /// the name.
    static let parentLimit = 32
    static let recordLimit = 64
    /// The longest name read, in bytes.
    static let nameLimit = 256

    /// Reads the task at `address`, or nil when what is there is no task.
    static func read(at address: UInt, layout: SwiftTaskLayout, readWord: (UInt) -> UInt?) -> TaskRecord? {
        guard address != 0, address % 16 == 0, readWord(address) == layout.taskMetadata,
            let flagsAndID = readWord(address &+ SwiftTaskLayout.flagsOffset),
            let status = readWord(address &+ SwiftTaskLayout.statusOffset),
            let base = readWord(address &+ SwiftTaskLayout.basePriorityOffset)
        else { return nil }
        let flags = SwiftTaskLayout.Flags(rawValue: UInt32(truncatingIfNeeded: flagsAndID))
        guard flags.isTask else { return nil }
        let name = flags.contains(.hasName) ? readName(of: address, readWord: readWord) : nil
        let parent = flags.contains(.isChild) ? readWord(address &+ layout.taskSize) : nil
        let task = StallTask(
            id: UInt64(flagsAndID >> 32), name: name,
            priority: TaskPriority(rawValue: UInt8(truncatingIfNeeded: status)),
            basePriority: TaskPriority(rawValue: UInt8(truncatingIfNeeded: base)), relation: flags.relation)
        return TaskRecord(task: task, parent: parent.flatMap { $0 == 0 ? nil : $0 })
    }

    /// What tells one task at an address from the next: its metadata, its
    /// flags and id, and its status word with the current priority.
    struct Identity: Equatable {
        var metadata: UInt
        var flagsAndID: UInt
        var status: UInt
    }

    /// The ``Identity`` of the task at `address` (one read through the
    /// kernel), or nil when what is there is no task.
    static func identity(at address: UInt, layout: SwiftTaskLayout) -> Identity? {
        let wordSize = UInt(MemoryLayout<UInt>.size)
        let count = Int(SwiftTaskLayout.statusOffset / wordSize) + 1
        var words = [UInt](repeating: 0, count: count)
        let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: address, into: $0) }
        guard copied == count, words[0] == layout.taskMetadata else { return nil }
        return Identity(
            metadata: words[0], flagsAndID: words[Int(SwiftTaskLayout.flagsOffset / wordSize)],
            status: words[count - 1])
    }

    /// The task at `address` and its parents, innermost first (empty when
    /// `address` holds no task). The parents stop at a top-level task, at one
    /// that cannot be read (`cut` says so) or after ``parentLimit``.
    static func chain(
        at address: UInt, layout: SwiftTaskLayout, readWord: (UInt) -> UInt?
    ) -> (tasks: [StallTask], cut: String?) {
        var tasks: [StallTask] = []
        var next: UInt? = address
        while let current = next {
            guard tasks.count <= parentLimit else { return (tasks, "more than \(parentLimit) parent tasks") }
            guard let record = read(at: current, layout: layout, readWord: readWord) else {
                return (
                    tasks, tasks.isEmpty ? nil : "the parent task at 0x\(String(current, radix: 16)) could not be read"
                )
            }
            tasks.append(record.task)
            next = record.parent
        }
        return (tasks, nil)
    }

    /// The name in the task's name record: the status records are searched
    /// from the newest (the name record is the task's first, so its last).
    private static func readName(of task: UInt, readWord: (UInt) -> UInt?) -> String? {
        var record = readWord(task &+ SwiftTaskLayout.statusOffset &+ SwiftTaskLayout.statusRecordOffset) ?? 0
        var searched = 0
        while record != 0, searched < recordLimit {
            searched += 1
            guard let kind = readWord(record) else { return nil }
            if UInt8(truncatingIfNeeded: kind) == SwiftTaskLayout.nameRecordKind {
                return readWord(record &+ SwiftTaskLayout.nameRecordNameOffset).flatMap {
                    readString(at: $0, readWord: readWord)
                }
            }
            record = readWord(record &+ SwiftTaskLayout.recordParentOffset) ?? 0
        }
        return nil
    }

    /// A NUL-terminated UTF-8 string of at most ``nameLimit`` bytes; nil when
    /// unreadable, unterminated or not UTF-8.
    private static func readString(at address: UInt, readWord: (UInt) -> UInt?) -> String? {
        guard address != 0 else { return nil }
        var bytes: [UInt8] = []
        var offset: UInt = 0
        while bytes.count < nameLimit {
            // Whole aligned words: a read never reaches past the word holding the NUL.
            let wordStart = (address &+ offset) & ~7
            guard let word = readWord(wordStart) else { return nil }
            var byteIndex = Int((address &+ offset) &- wordStart)
            while byteIndex < 8 {
                let byte = UInt8(truncatingIfNeeded: word >> UInt(8 * byteIndex))
                if byte == 0 { return String(validating: bytes, as: UTF8.self) }
                bytes.append(byte)
                byteIndex += 1
                offset += 1
            }
        }
        return nil
    }
}

/// A sampled thread's task and its parents, innermost first (never empty),
/// and why the parents stop early, if they do.
struct TaskChain: Sendable, Equatable {
    var tasks: [StallTask]
    var cut: String?
}

extension StallBacktrace {
    /// This backtrace with `chain` as its task and parents.
    func naming(_ chain: TaskChain?) -> StallBacktrace {
        guard let chain else { return self }
        var named = self
        named.task = chain.tasks.first
        named.parentTasks = Array(chain.tasks.dropFirst())
        named.parentTasksCut = chain.cut
        return named
    }
}
