extension DelayedWork {
    /// Schedules `work` to run once on a Swift executor after `delay`: a
    /// SwiftNIO event loop's, say, so that a request's timeout runs on the
    /// request's own loop.
    ///
    /// ```swift
    /// let timeout = DelayedWork.schedule(after: .seconds(30), executor: channel.eventLoop.executor) {
    ///     channel.close(promise: nil)
    /// }
    /// // On the loop, when the response is written:
    /// _ = timeout.cancelWithoutWaiting()
    /// ```
    ///
    /// `executor` is where `work` runs: a Swift executor, such as a SwiftNIO event loop's `executor`, an
    /// actor's custom executor, or a `TaskExecutor`. Each delivery starts a task whose one job is enqueued
    /// directly on `executor` (no dispatch queue in between); handlers due together for the same executor
    /// object share a task per 16, enqueued in deadline order (so they run in that order on an executor that
    /// runs its jobs in the order they come, as event loops and actors do). Under a `ManualTimerScheduler`
    /// `work` runs inside `advance(by:)` instead. The primitive keeps `executor` alive for as long as it
    /// exists, as it keeps a queue. An executor that never runs its jobs (a
    /// SwiftNIO event loop that has shut down) is covered in
    /// <doc:ChoosingATimer#Where-handlers-run>: no crash, and `cancel()` returns.
    ///
    /// Everything else is as in ``schedule(after:on:scheduler:_:)``.
    public static func schedule(
        after delay: Duration,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        schedule(after: delay, executor: .onExecutor(executor), engine: EngineReference(scheduler), work)
    }

    /// Schedules `work` to run once on a Swift executor at `deadline`, an
    /// instant of `scheduler`'s ``TimerScheduler/clock``; see
    /// ``schedule(at:on:scheduler:_:)`` and ``schedule(after:executor:scheduler:_:)``.
    public static func schedule(
        at deadline: TimerClock.Instant,
        executor: any Executor,
        scheduler: (any TimerScheduler)? = nil,
        _ work: @escaping @Sendable () -> Void
    ) -> DelayedWork {
        DelayedWork.scheduled(
            executor: .onExecutor(executor), engine: EngineReference(scheduler), work: work,
            at: deadline.ticks)
    }
}
