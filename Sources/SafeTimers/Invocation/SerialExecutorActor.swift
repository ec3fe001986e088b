/// An actor whose executor is a given `SerialExecutor` (a SwiftNIO event
/// loop's, say): a task isolated to it starts directly on that executor, and
/// its first job finds itself where it must run, so a handler costs the
/// executor one job.
///
/// (A task that merely *prefers* a task executor which forwards its jobs to a
/// serial executor costs two: the executor runs the job as itself, not as the
/// preferred task executor, and the task's first step hops to the latter.)
actor SerialExecutorActor {
    let serialExecutor: any SerialExecutor
    /// The executor object's identity, so that handlers due together for it go
    /// out in one task.
    nonisolated let identity: ObjectIdentifier

    init(_ serialExecutor: any SerialExecutor) {
        self.serialExecutor = serialExecutor
        identity = ObjectIdentifier(serialExecutor)
    }

    nonisolated var unownedExecutor: UnownedSerialExecutor {
        serialExecutor.asUnownedSerialExecutor()
    }

    /// Starts a task that runs `body` on the actor's executor; callable from
    /// any thread.
    ///
    /// Starting a task touches nothing isolated to the actor: the isolated
    /// parameter only gives the task's closure its isolation (which makes the
    /// task's first job go to the actor's executor). So this calls
    /// ``startTask(on:_:)`` as if from the actor, the way `assumeIsolated`
    /// calls its operation once it has checked.
    nonisolated func startTask(running body: @escaping @Sendable () -> Void) {
        typealias Isolated = (isolated SerialExecutorActor, @escaping @Sendable () -> Void) -> Void
        typealias Plain = (SerialExecutorActor, @escaping @Sendable () -> Void) -> Void
        let start: Isolated = SerialExecutorActor.startTask(on:_:)
        unsafeBitCast(start, to: Plain.self)(self, body)
    }

    private static func startTask(on actor: isolated SerialExecutorActor, _ body: @escaping @Sendable () -> Void) {
        Task { actor.run(body) }
    }

    private func run(_ body: () -> Void) {
        body()
    }
}
