import Dispatch

/// Where a primitive runs its user handler: a `DispatchQueue`, or the main actor.
enum HandlerExecutor: Sendable {
    case queue(DispatchQueue)
    case mainActor

    /// Runs `body` where the handler belongs.
    ///
    /// Under a manual scheduler (`engine.isVirtual`), `body` runs inline, on the
    /// thread that advances time, so tests need no waiting; a main-actor handler
    /// runs inline only when that thread is the main thread, and is otherwise
    /// enqueued on the main actor (it never traps). Otherwise `body` goes to the
    /// queue, or to the main actor through a task, which works under a run loop,
    /// `dispatchMain()` and an async `main` alike.
    @inline(__always)
    func deliver(engine: TimerEngine, _ body: @escaping @Sendable () -> Void) {
        switch self {
        case .queue(let queue):
            if engine.isVirtual {
                body()
            } else {
                queue.async(execute: body)
            }
        case .mainActor:
            if engine.isVirtual && ThreadIdentity.isMainThread {
                body()
            } else {
                Task { @MainActor in body() }
            }
        }
    }

    /// Wraps a main-actor handler so that it can be stored as a plain one: the
    /// executor runs it only on the main actor.
    static func adapt(_ handler: @escaping @MainActor @Sendable () -> Void) -> @Sendable () -> Void {
        { MainActor.assumeIsolated { handler() } }
    }
}
