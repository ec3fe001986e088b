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
/// never begins after `withWatchdog` has returned.
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    queue: DispatchQueue = .global(),
    scheduler: any TimerScheduler = SystemTimerScheduler.shared,
    onTimeout: @escaping @Sendable () -> Void,
    _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    let watchdog = Watchdog(timeout: timeout, queue: queue, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try body()
}

/// Runs the asynchronous `body` under a ``Watchdog``: `onTimeout` is called (on
/// `queue`) if `body` is still running after `timeout`. `body` always runs to
/// completion and is not cancelled; to cancel work at a deadline use
/// ``withTimeout(_:scheduler:isolation:operation:)``.
///
/// ```swift
/// let image = try await withWatchdog(timeout: .seconds(1), onTimeout: { report("slow decode") }) {
///     try await decoder.decode(data)
/// }
/// ```
public func withWatchdog<Result, Failure: Error>(
    timeout: Duration,
    queue: DispatchQueue = .global(),
    scheduler: any TimerScheduler = SystemTimerScheduler.shared,
    onTimeout: @escaping @Sendable () -> Void,
    isolation: isolated (any Actor)? = #isolation,
    _ body: () async throws(Failure) -> Result
) async throws(Failure) -> Result {
    let watchdog = Watchdog(timeout: timeout, queue: queue, scheduler: scheduler, onTimeout: onTimeout)
    defer { watchdog.invalidate() }
    return try await body()
}
