/// The Swift task a blocked thread was running when it was sampled, as the
/// concurrency runtime records it: its name, priority and how it was made.
///
/// Read from the runtime's own records without calling into it (a sampled
/// thread may hold the runtime's locks), and only where the detector has
/// checked, once per process, that it reads them right: it makes tasks of
/// known names, priorities and kinds and reads them back before it trusts the
/// layout. Where that check fails (a Swift runtime whose task layout differs
/// from Swift 6.3's), or on Apple platforms, which sample no stacks yet, a
/// backtrace has no task (``StallBacktrace/task`` is nil), never a guessed one.
public struct StallTask: Sendable, Equatable, CustomStringConvertible {
    /// How the task was made.
    public enum Relation: String, Sendable, Hashable {
        /// An unstructured task (`Task { }`, `Task.detached { }`), or the
        /// main task of an async `main`: no parent task.
        case topLevel = "top-level task"
        /// A child task added to a task group (`group.addTask`), discarding
        /// or not.
        case taskGroupChild = "child task of a task group"
        /// The child task of an `async let`.
        case asyncLetChild = "async let child task"
        /// A child task of another kind.
        case child = "child task"
    }

    /// The runtime's id of the task (its `Job` id: the low 32 bits of the
    /// task's id), as lldb and `swift-inspect` show it.
    public let id: UInt64
    /// The name given with `Task(name:)`, `Task.detached(name:)` or
    /// `group.addTask(name:)`; nil for a task without one.
    public let name: String?
    /// The priority the task ran at when sampled: its base priority, or higher
    /// when a waiter escalated it.
    public let priority: TaskPriority
    /// The priority the task was created with.
    public let basePriority: TaskPriority
    /// How the task was made.
    public let relation: Relation

    /// `"name" (id 42, high priority, child task of a task group)`; a task
    /// without a name is shown as `unnamed (id 42, …)`.
    public var description: String {
        var details = ["\(Self.describe(priority)) priority"]
        if priority != basePriority { details[0] += " (escalated from \(Self.describe(basePriority)))" }
        details.append(relation.rawValue)
        let title = name.map { "\"\($0)\"" } ?? "unnamed"
        return title + " (id \(id), " + details.joined(separator: ", ") + ")"
    }

    /// A priority's name where it has one (`high`, `medium`, `low`,
    /// `background`), its raw value otherwise.
    static func describe(_ priority: TaskPriority) -> String {
        switch priority.rawValue {
        case TaskPriority.high.rawValue: "high"
        case TaskPriority.medium.rawValue: "medium"
        case TaskPriority.low.rawValue: "low"
        case TaskPriority.background.rawValue: "background"
        case 0: "unspecified"
        default: "\(priority.rawValue)"
        }
    }
}
