/// What one function on a stack says about its thread, from the function's name
/// alone (``StackShape``'s markers): a sample is judged by these before any frame
/// of it is named in full, and the judgement of each address is kept.
struct FrameKind: OptionSet, Hashable, Sendable {
    let rawValue: UInt8

    init(rawValue: UInt8) {
        self.rawValue = rawValue
    }

    /// The function has a name.
    static let named = FrameKind(rawValue: 1 << 0)
    /// Runs somebody's code for a queue or run loop (``StackShape/busyMarkers``).
    static let job = FrameKind(rawValue: 1 << 1)
    /// libdispatch's manager thread (``StackShape/managerMarkers``).
    static let manager = FrameKind(rawValue: 1 << 2)
    /// Waits for work (``StackShape/idleMarkers``).
    static let idle = FrameKind(rawValue: 1 << 3)
    /// An event-wait system call (``StackShape/eventWaitCalls``).
    static let eventWait = FrameKind(rawValue: 1 << 4)
    /// A thread's root (``StackShape/threadRoots``).
    static let root = FrameKind(rawValue: 1 << 5)
    /// Runs a Swift concurrency job.
    static let swiftJob = FrameKind(rawValue: 1 << 6)
    /// libdispatch calling a job's block: one per queue whose job is running on
    /// the thread (two when a job waits in another queue's `sync`).
    static let callout = FrameKind(rawValue: 1 << 7)

    /// The kinds of the function named `name`.
    init(name: String?) {
        guard let name else {
            self = []
            return
        }
        var kind: FrameKind = .named
        if StackShape.busyMarkers.contains(where: { name.containsText($0) }) { kind.insert(.job) }
        if StackShape.managerMarkers.contains(where: { name.containsText($0) }) { kind.insert(.manager) }
        if StackShape.idleMarkers.contains(where: { name.containsText($0) }) { kind.insert(.idle) }
        if StackShape.eventWaitCalls.contains(where: { name.containsText($0) }) { kind.insert(.eventWait) }
        if StackShape.threadRoots.contains(where: { name.hasPrefix($0) || name.containsText("_" + $0) }) {
            kind.insert(.root)
        }
        if name.containsText("swift_job_run") { kind.insert(.swiftJob) }
        if name == "_dispatch_client_callout" { kind.insert(.callout) }
        self = kind
    }
}
