import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where the Swift concurrency runtime keeps what a report says of a task,
/// and whether this process's runtime keeps it there: checked once per process
/// before any report names a task.
///
/// The facts of the ABI this reads, in one place (Swift 6.3's `Job` and
/// `AsyncTask` in `include/swift/ABI/Task.h`, `ActiveTaskStatus` and
/// `TaskNameStatusRecord` in the runtime's private headers, read back from
/// `libswift_Concurrency.so` 6.3.1's `swift_task_basePriority`,
/// `swift_task_currentPriority` and `AsyncTask::getTaskName`), 64-bit only:
/// - a task's first word is its heap metadata: the runtime's
///   `_swift_concurrency_debug_asyncTaskMetadata`, or, where a statically
///   linked runtime exports nothing, the first word of a task of the check's
///   own;
/// - the job flags (32 bits) at 0x20, the task's id (32 bits) after them;
/// - the status at 0x60: a word whose low byte is the current priority, then
///   the newest status record;
/// - the base priority's byte at 0x98;
/// - a status record: its kind's byte first, its older record at 8; the name
///   record's kind is 6, its name (a C string) at 0x10;
/// - a child task's parent is the first word after the task's fixed part
///   (`_swift_concurrency_debug_asyncTaskSize`, 0xd0 in 6.3).
///
/// The thread-local slot of the task a thread runs (the runtime's
/// `swift_task_getCurrent` reads it through `__tls_get_addr`, which a signal
/// handler must not call) is found from inside a task of known address, in the
/// thread-local block of the image holding the runtime, as an offset from the
/// thread pointer, the same in every thread.
///
/// The check (``locate()``, from a detector's start) makes a named detached
/// task of known priority, an `async let` child and a task group child, reads
/// each back by this layout from its own thread's slot, and keeps the layout
/// only when every fact matches. A runtime that moved any of them (a later
/// Swift, a 32-bit platform) fails the check: reports then name no task.
struct SwiftTaskLayout: Sendable, Equatable {
    /// The value of a task's first word.
    let taskMetadata: UInt
    /// Where a child task's parent lies: the size of the task's fixed part.
    let taskSize: UInt

    static let flagsOffset: UInt = 0x20
    static let statusOffset: UInt = 0x60
    static let statusRecordOffset: UInt = 8
    static let basePriorityOffset: UInt = 0x98
    static let recordParentOffset: UInt = 8
    static let nameRecordKind: UInt8 = 6
    static let nameRecordNameOffset: UInt = 0x10

    /// The job flags a report uses (`JobFlags` in `MetadataValues.h`).
    struct Flags: OptionSet, Sendable {
        let rawValue: UInt32
        static let isChild = Flags(rawValue: 1 << 24)
        static let isGroupChild = Flags(rawValue: 1 << 26)
        static let isAsyncLet = Flags(rawValue: 1 << 28)
        static let hasName = Flags(rawValue: 1 << 30)

        /// Whether the job is a task: its kind (the low byte) is 0.
        var isTask: Bool { rawValue & 0xFF == 0 }

        var relation: StallTask.Relation {
            if contains(.isGroupChild) { return .taskGroupChild }
            if contains(.isAsyncLet) { return .asyncLetChild }
            return contains(.isChild) ? .child : .topLevel
        }
    }

    /// Where the check stands.
    enum Check: Sendable, Equatable {
        case notStarted
        case underWay
        case verified(SwiftTaskLayout)
        case failed(String)
    }

    private static let check = Locked<Check>(.notStarted)

    /// The verified layout, or nil (not checked yet, or the check failed).
    static var verified: SwiftTaskLayout? {
        if case .verified(let layout) = check.withLock({ $0 }) { return layout }
        return nil
    }

    /// Where the check stands (tests, and the reason a report names no task).
    static var state: Check { check.withLock { $0 } }

    /// The name of the task the check makes.
    static let checkTaskName = "SafeTimers.StallDetection task layout check"

    /// Starts the check once per process (a detector's start): a detached task
    /// of low priority, never waited for. Until it has run, and where the
    /// cooperative pool is blocked meanwhile, reports name no task.
    static func locate() {
        #if os(Linux) && arch(x86_64) || os(Linux) && arch(arm64)
        let starts = check.withLock { check -> Bool in
            guard check == .notStarted else { return false }
            check = .underWay
            return true
        }
        guard starts else { return }
        let exported = exportedFacts()
        Task.detached(name: checkTaskName, priority: .low) {
            let outcome = await TaskLayoutCheck(exported: exported).run()
            check.withLock { $0 = outcome }
        }
        #else
        check.withLock { $0 = .failed("tasks are read on 64-bit Linux only") }
        #endif
    }

    /// Swift 6.3's size of a task's fixed part, where no runtime says it.
    static let defaultTaskSize: UInt = 0xD0

    /// The task metadata and task size the shared runtime exports for
    /// debuggers (`_swift_concurrency_debug_asyncTaskMetadata`,
    /// `…_asyncTaskSize`), when its layout version is 1, Swift 6.3's (a
    /// runtime that changes what lldb reads raises it); nil where they are not
    /// exported (a runtime linked statically) or the version differs. The
    /// check then reads the metadata from a task of its own.
    static func exportedFacts() -> (found: Bool, layout: SwiftTaskLayout?) {
        let handle = UnsafeMutableRawPointer(bitPattern: 0)
        guard let metadata = dlsym(handle, "_swift_concurrency_debug_asyncTaskMetadata"),
            let size = dlsym(handle, "_swift_concurrency_debug_asyncTaskSize"),
            let version = dlsym(handle, "_swift_concurrency_debug_internal_layout_version")
        else { return (false, nil) }
        guard version.load(as: UInt32.self) == 1 else { return (true, nil) }
        return (true, SwiftTaskLayout(taskMetadata: metadata.load(as: UInt.self), taskSize: size.load(as: UInt.self)))
    }

    /// The address of the task running this code, or 0 outside any.
    static func currentTaskAddress() -> UInt {
        withUnsafeCurrentTask { task in task.map { unsafeBitCast($0, to: UInt.self) } ?? 0 }
    }
}
