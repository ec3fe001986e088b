/// A Swift executor that handlers run on (a primitive made with `executor:`):
/// a SwiftNIO event loop's `executor`, an actor's custom executor, a
/// `TaskExecutor`.
///
/// A delivery starts a task that runs the handler synchronously, and whose one
/// job is enqueued directly on the executor, so the handler runs there with no
/// dispatch queue in between: for a `SerialExecutor` (what an event loop
/// offers) a task isolated to a ``SerialExecutorActor`` of that executor, for a
/// `TaskExecutor` a task that prefers it. Another kind of executor is reached
/// through ``JobForwardingExecutor``, which hands it the task's jobs unchanged.
struct ExecutorDestination: Sendable {
    private enum Route: Sendable {
        case serial(SerialExecutorActor)
        case task(any TaskExecutor)
    }

    private let route: Route
    /// The given executor object's identity (executors are objects), so that
    /// handlers due together for it go out in one task.
    let identity: ObjectIdentifier
    /// Whether the executor runs one job at a time (it was given as a
    /// `SerialExecutor`): a batch of handlers for it needs no helper task.
    let isSerial: Bool

    init(_ executor: any Executor) {
        if let serial = executor as? any SerialExecutor {
            route = .serial(SerialExecutorActor(serial))
            isSerial = true
        } else {
            route = .task((executor as? any TaskExecutor) ?? JobForwardingExecutor(executor))
            isSerial = false
        }
        identity = ObjectIdentifier(executor)
    }

    /// Runs `body` on the executor, in a task of its own.
    @inline(__always)
    func run(_ body: @escaping @Sendable () -> Void) {
        switch route {
        case .serial(let actor): actor.startTask(running: body)
        case .task(let executor): Task(executorPreference: executor) { body() }
        }
    }

    /// Whether both name the same executor object.
    func isSame(as other: ExecutorDestination) -> Bool {
        identity == other.identity
    }
}
