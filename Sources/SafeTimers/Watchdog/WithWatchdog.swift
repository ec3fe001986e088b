import Dispatch

/// Runs `body` under a ``Watchdog``: `onTimeout` is called (on `queue`) if `body`
/// is still running after `timeout`. `body` always runs to completion; its result
/// or error is returned as is.
///
/// ```swift
/// let rows = try withWatchdog(timeout: .milliseconds(500), onTimeout: { report("slow query") }) {
///     try database.query(sql)
/// }
/// ```
///
/// The watchdog is invalidated when `body` returns or throws, so `onTimeout`
/// never begins after `withWatchdog` has returned; if it was already running on
/// another thread, `withWatchdog` waits for it to return, with one exception:
/// when that wait would close a cycle of waits (`onTimeout` itself waits for
/// the code that called `withWatchdog`, say it cancels the `DelayedWork` whose
/// handler runs the section), `withWatchdog` returns without waiting, and
/// `onTimeout` is still running, to return later.
///
/// An overrun is reported only if `onTimeout` *begins* before the section
/// ends: when `body` returns after `timeout` but before the delivered
/// `onTimeout` has started on `queue` (a busy queue, say), the report is
/// dropped and `onTimeout` never runs. So a report means "still running when
/// the handler began", never "took longer than `timeout`" after the fact.
///
/// - Parameters:
///   - timeout: How long `body` may take. Zero or negative: report as soon as
///     possible; too long to represent: never.
///   - queue: Where `onTimeout` runs; `nil` (the default) is a serial queue of
///     its own, made for that report (see ``Watchdog/init(timeout:queue:scheduler:onTimeout:)``).
///   - scheduler: The scheduler that keeps the deadline; `nil` (the default) is
///     ``SystemTimerScheduler/shared``.
///   - onTimeout: Called once if `body` is still running after `timeout`;
///     released before `withWatchdog` returns.
///   - body: The guarded section.
///
/// - Complexity: On ``SystemTimerScheduler/shared`` (the default) a section costs two atomic
///   operations on a slot that belongs to the calling thread and a clock read:
///   no lock, no allocation, no engine work while sections keep ending in time
///   (the thread's engine entry is moved lazily, at most once per `timeout`).
///   A nested section takes the ordinary ``Watchdog`` path.
///   Timeouts of a second or more are measured with the coarse monotonic clock
///   on Linux, so `onTimeout` may run up to three of its ticks (12 ms on a
///   typical Linux) later than the timeout.
@inlinable
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    queue: DispatchQueue? = nil,
    scheduler: (any TimerScheduler)? = nil,
    onTimeout: @escaping @Sendable () -> Void,
    _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    if let slot = WatchdogSlot.current(for: scheduler),
        let generation = slot._withUnsafeGuaranteedRef({
            $0.enter(timeout: timeout, queue: queue, onTimeout: onTimeout)
        })
    {
        // The thread's slot lives as long as the thread: no reference count needed.
        defer { slot._withUnsafeGuaranteedRef { $0.leave(generation) } }
        return try body()
    }
    let watchdog = Watchdog(
        timeout: timeout, queue: queue, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try body()
}

/// Runs the asynchronous `body` under a ``Watchdog``: `onTimeout` is called (on
/// `queue`) if `body` is still running after `timeout`. `body` always runs to
/// completion and is not cancelled; to cancel work at a deadline use
/// ``withTimeout(_:scheduler:isolation:operation:)``. `queue: nil` (the default)
/// is a serial queue of its own, made for that report.
///
/// ```swift
/// let image = try await withWatchdog(timeout: .seconds(1), onTimeout: { report("slow decode") }) {
///     try await decoder.decode(data)
/// }
/// ```
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    queue: DispatchQueue? = nil,
    scheduler: (any TimerScheduler)? = nil,
    onTimeout: @escaping @Sendable () -> Void,
    isolation: isolated (any Actor)? = #isolation,
    _ body: () async throws(Failure) -> Result
) async throws(Failure) -> Result {
    let watchdog = Watchdog(timeout: timeout, queue: queue, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try await body()
}

/// Runs `body` under a watchdog whose `onTimeout` runs on a Swift executor (a
/// SwiftNIO event loop's `executor`, a `TaskExecutor`): the executor form of
/// ``withWatchdog(timeout:queue:scheduler:onTimeout:_:)``. Each section arms a
/// ``Watchdog`` (the per-thread fast path is for queues).
///
/// ```swift
/// let page = withWatchdog(timeout: .milliseconds(50), executor: loop.executor, onTimeout: { log("slow render") }) {
///     renderPage()
/// }
/// ```
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    executor: any Executor,
    scheduler: (any TimerScheduler)? = nil,
    onTimeout: @escaping @Sendable () -> Void,
    _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    let watchdog = Watchdog(timeout: timeout, executor: executor, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try body()
}

/// Runs the asynchronous `body` under a ``Watchdog`` whose `onTimeout` runs on a
/// Swift executor; see ``withWatchdog(timeout:queue:scheduler:onTimeout:isolation:_:)``.
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    executor: any Executor,
    scheduler: (any TimerScheduler)? = nil,
    onTimeout: @escaping @Sendable () -> Void,
    isolation: isolated (any Actor)? = #isolation,
    _ body: () async throws(Failure) -> Result
) async throws(Failure) -> Result {
    let watchdog = Watchdog(timeout: timeout, executor: executor, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try await body()
}
