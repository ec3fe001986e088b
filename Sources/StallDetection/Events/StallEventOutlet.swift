import Synchronization

/// Where a detector's events go: its ``StallDetector/events`` stream and, when
/// one was given, its `onEvent` handler, called in order on a thread of the
/// detector's own (a ``DetectorWorker``: never the watched target's thread or
/// executor, never a dispatch worker the program's blocked queues could all
/// hold, and never the thread the detector looks from, so a slow handler delays
/// no look).
final class StallEventOutlet: Sendable {
    private let continuation: AsyncStream<StallEvent>.Continuation
    private let handler: (@Sendable (StallEvent) -> Void)?
    private let handlerThread: DetectorWorker?
    /// Set by ``finish()``: ``open``, ``finished`` (from outside the handler) or
    /// ``finishedFromHandler``; it only moves forward. Calls are handed to the
    /// handler's thread under this lock, and only while open: every call handed over
    /// is queued there before ``finish()`` waits for it. (A ``Locked``, which
    /// ThreadSanitizer sees: it reported the handler's `finish()` and a
    /// concurrent `publish` under a `Synchronization.Mutex` as a race.)
    private let closing = Locked<UInt8>(StallEventOutlet.open)
    /// One more than the id of the last `.started` event the handler was called
    /// with (0: none yet). Written and read only on the handler's thread.
    private let startedCalled = Atomic<UInt64>(0)

    private static let open: UInt8 = 0
    private static let finished: UInt8 = 1
    private static let finishedFromHandler: UInt8 = 2

    init(continuation: AsyncStream<StallEvent>.Continuation, handler: (@Sendable (StallEvent) -> Void)?) {
        self.continuation = continuation
        self.handler = handler
        handlerThread = handler.map { _ in DetectorWorker(name: "StallOnEvent") }
    }

    /// Yields `event` to the stream and hands it to the handler; after
    /// ``finish()``, does nothing.
    func publish(_ event: StallEvent) {
        continuation.yield(event)
        guard let handler, let handlerThread else { return }
        closing.withLock { closing in
            guard closing == Self.open else { return }
            // Only enqueues (no user code under the lock).
            handlerThread.async { [self] in
                guard calls(with: event) else { return }
                handler(event)
                if event.phase == .started { startedCalled.store(event.id &+ 1, ordering: .relaxed) }
            }
        }
    }

    /// Whether the handler, about to begin a call, is called with `event`: always
    /// before ``finish()``; after it, only with an `.ended` event whose `.started`
    /// it was called with, so that a handler that keeps track of open stalls is
    /// left with none open; after a ``finish()`` from the handler itself, never.
    private func calls(with event: StallEvent) -> Bool {
        switch closing.withLock({ $0 }) {
        case Self.open: true
        case Self.finished: event.phase == .ended && startedCalled.load(ordering: .relaxed) == event.id &+ 1
        default: false
        }
    }

    /// Whether the calling thread is this outlet's handler's, in a call.
    var isHandlerThread: Bool { handlerThread?.isCurrent ?? false }

    /// Called from the handler while a ``finish()`` from elsewhere is under
    /// way (which waits for this call of the handler): the handler is not
    /// called again once this returns; the stream is left to that finish,
    /// which ends it after the events published before it.
    func closeFromHandler() {
        closing.withLock { closing in closing = max(closing, Self.finishedFromHandler) }
    }

    /// Waits until the handler has made every call handed over so far (not
    /// from the handler itself: that would wait for itself).
    func waitForHandler() {
        guard let handlerThread, !handlerThread.isCurrent else { return }
        handlerThread.sync {}
    }

    /// Ends the stream, and waits for the handler's calls handed over before
    /// (unless this is called from the handler): a call not begun is dropped,
    /// except one with an `.ended` event whose `.started` the handler was called
    /// with, which is made now. Once this returns, the handler is not running (on
    /// another thread) and is not called again. Called from this outlet's handler,
    /// it returns at once and every call not begun is dropped. Called once
    /// nothing more is published.
    ///
    /// Called from another outlet's handler it waits like any caller, so two
    /// handlers that finish each other's outlets can wait for each other.
    func finish() {
        continuation.finish()
        let fromHandler = handlerThread?.isCurrent ?? false
        closing.withLock { closing in
            closing = max(closing, fromHandler ? Self.finishedFromHandler : Self.finished)
        }
        if let handlerThread, !fromHandler {
            handlerThread.sync {}
        }
        handlerThread?.finish()
    }
}
