import CStallCapture
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension StallDetector {
    /// Runs `body` with `label` as the current thread's activity, so that a stall
    /// that happens inside `body` names it in ``StallEvent/activities``.
    ///
    /// ```swift
    /// let rows = try StallDetector.withActivity("sync contacts") { try db.fetchAll() }
    ///
    /// // Which screen was on when the main thread hung:
    /// StallDetector.withActivity("screen: Feed") {
    ///     StallDetector.withActivity("layout") { layoutFeed() }
    /// }
    /// // a stall inside layoutFeed() reports activities ["screen: Feed", "layout"]
    /// ```
    ///
    /// Activities nest: a report lists those active on the blocked thread,
    /// outermost first. They belong to the thread that calls this method: a stall
    /// on another thread never shows them. When `body` returns or throws, the label
    /// is gone.
    ///
    /// Cheap enough to wrap every request or screen update: a few nanoseconds when
    /// the same label was used at this depth before on this thread (any string
    /// literal is), plus one uncontended lock when a different label takes its
    /// place. The first call on a thread registers it (a lock and an allocation).
    /// A label deeper than ``maximumActivityDepth`` is not kept (the report says how
    /// many were left out).
    ///
    /// Thread safety: call it from any thread; each thread has its own activities.
    ///
    /// - Parameters:
    ///   - label: What the thread is doing, as a user would say it.
    ///   - body: The work; its result or error is passed through.
    /// - Returns: What `body` returns.
    /// - Complexity: O(1).
    @inlinable
    public static func withActivity<Result>(_ label: String, _ body: () throws -> Result) rethrows -> Result {
        let token = _beginActivity(label)
        defer { _endActivity(token) }
        return try body()
    }

    /// Pushes `label` on the calling thread's activities (the non-generic half of
    /// ``withActivity(_:_:)``, so that the caller's closure is inlined into it).
    @usableFromInline
    static func _beginActivity(_ label: String) -> ActivityToken {
        guard let record = ActivityRecord.current() else { return ActivityToken(record: nil, depth: 0) }
        let depth = record._withUnsafeGuaranteedRef { $0.push(label) }
        return ActivityToken(record: record.toOpaque(), depth: depth)
    }

    /// Pops back to where `token` was pushed.
    @usableFromInline
    static func _endActivity(_ token: ActivityToken) {
        guard let raw = token.record else { return }
        Unmanaged<ActivityRecord>.fromOpaque(raw)._withUnsafeGuaranteedRef { $0.pop(to: token.depth) }
    }

    /// The deepest nesting of ``withActivity(_:_:)`` whose labels are kept: 32.
    public static let maximumActivityDepth = ActivityRecord.capacity
}

/// What ``StallDetector/withActivity(_:_:)`` pops when its body returns: the
/// thread's record (owned by the registry while the thread lives) and the depth
/// before the push.
@usableFromInline
struct ActivityToken {
    let record: UnsafeMutableRawPointer?
    let depth: Int

    @usableFromInline
    init(record: UnsafeMutableRawPointer?, depth: Int) {
        self.record = record
        self.depth = depth
    }
}
