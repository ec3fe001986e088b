extension RepeatingTimer {
    /// Creates a timer whose handler runs on a Swift executor: a SwiftNIO event
    /// loop's, say, so that a connection's heartbeat runs on the connection's loop.
    ///
    /// ```swift
    /// let keepAlive = RepeatingTimer(interval: .seconds(15), executor: channel.eventLoop.executor) {
    ///     ping()   // on the connection's loop
    /// }
    /// keepAlive.start()
    /// ```
    ///
    /// `executor` is where the handler runs: a Swift executor, such as a SwiftNIO event loop's `executor`, an
    /// actor's custom executor, or a `TaskExecutor`. Each delivery starts a task whose one job is enqueued
    /// directly on `executor` (no dispatch queue in between); handlers due together for the same executor
    /// object share a task per 16, enqueued in deadline order (so they run in that order on an executor that
    /// runs its jobs in the order they come, as event loops and actors do). Under a `ManualTimerScheduler`
    /// the handler runs inside `advance(by:)` instead. The primitive keeps `executor` alive for as long as it
    /// exists, as it keeps a queue. An executor that never runs its jobs (a
    /// SwiftNIO event loop that has shut down) is covered in
    /// <doc:ChoosingATimer#Where-handlers-run>: no crash, and `cancel()` returns.
    ///
    /// Everything else is as in
    /// ``init(interval:leeway:repetitions:firesImmediately:missedTicks:queue:scheduler:handler:)``.
    public convenience init(
        interval: Duration,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @Sendable () -> Void
    ) {
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .onExecutor(executor), scheduler: scheduler,
            coreHandler: .plain(handler))
    }

    /// Creates a timer bound to `owner` whose handler runs on a Swift executor;
    /// see ``init(interval:owner:leeway:repetitions:firesImmediately:missedTicks:queue:scheduler:handler:)``
    /// for the owner and ``init(interval:leeway:repetitions:firesImmediately:missedTicks:executor:scheduler:handler:)``
    /// for the executor.
    public convenience init<Owner: AnyObject & Sendable>(
        interval: Duration,
        owner: Owner,
        leeway: Duration = .zero,
        repetitions: Int? = nil,
        firesImmediately: Bool = false,
        missedTicks: MissedTickPolicy = .coalesce,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil,
        handler: @escaping @Sendable (Owner) -> Void
    ) {
        self.init(
            interval: interval, leeway: leeway, repetitions: repetitions, firesImmediately: firesImmediately,
            missedTicks: missedTicks, executor: .onExecutor(executor), scheduler: scheduler,
            coreHandler: Self.ownedHandler(owner, handler))
    }
}
