/// A `TaskExecutor` that handlers run on (a primitive made with `executor:`
/// given one): a delivery starts a task that prefers it and runs the handler
/// synchronously, so the task's one job is enqueued on it directly, with no
/// dispatch queue in between. (A `SerialExecutor`, such as an event loop's, is
/// reached through a ``SerialExecutorActor`` instead.)
///
/// An object, so that ``HandlerExecutor`` stays one reference wide.
final class TaskExecutorDestination: Sendable {
    let executor: any TaskExecutor
    /// The executor object's identity, so that handlers due together for it go
    /// out in one task.
    let identity: ObjectIdentifier

    init(_ executor: any TaskExecutor, identity: ObjectIdentifier) {
        self.executor = executor
        self.identity = identity
    }

    /// Runs `body` on the executor, in a task of its own.
    @inline(__always)
    func run(_ body: @escaping @Sendable () -> Void) {
        Task(executorPreference: executor) { body() }
    }
}
