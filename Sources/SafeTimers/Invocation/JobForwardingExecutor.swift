/// A `TaskExecutor` that hands every job to another executor unchanged, so that
/// a task can be started directly on an executor that is neither a
/// `SerialExecutor` nor a `TaskExecutor`.
final class JobForwardingExecutor: TaskExecutor {
    let target: any Executor

    init(_ target: any Executor) {
        self.target = target
    }

    func enqueue(_ job: consuming ExecutorJob) {
        target.enqueue(job)
    }
}
