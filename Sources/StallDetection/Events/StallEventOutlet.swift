import Dispatch
import Synchronization

/// Where a detector's events go: its ``StallDetector/events`` stream and, when
/// one was given, its `onEvent` handler, called in order on a serial queue of the
/// detector's own (never on the watched target's thread or executor, and never on
/// the queue the detector looks from, so a slow handler delays no look).
final class StallEventOutlet: Sendable {
    private let continuation: AsyncStream<StallEvent>.Continuation
    private let handler: (@Sendable (StallEvent) -> Void)?
    private let handlerQueue: DispatchQueue?
    /// Set by ``finish()``: ``open``, ``finished`` (from outside the handler) or
    /// ``finishedFromHandler``; it only moves forward. Calls are handed to the
    /// handler queue under this lock, and only while open: every call handed over
    /// is on the queue before ``finish()`` waits for it. (A ``Locked``, which
    /// ThreadSanitizer sees: it reported the handler's `finish()` and a
    /// concurrent `publish` under a `Synchronization.Mutex` as a race.)
    private let closing = Locked<UInt8>(StallEventOutlet.open)
    /// One more than the id of the last `.started` event the handler was called
    /// with (0: none yet). Written and read only on the handler queue.
    private let startedCalled = Atomic<UInt64>(0)

    private static let open: UInt8 = 0
    private static let finished: UInt8 = 1
    private static let finishedFromHandler: UInt8 = 2

    /// Marks this outlet's handler queue, so that ``finish()`` called from this
    /// outlet's handler does not wait for itself (and called from another
    /// detector's handler, does wait).
    private let mark: HandlerQueueMark
    private static let handlerQueueMark = DispatchSpecificKey<HandlerQueueMark>()

    init(continuation: AsyncStream<StallEvent>.Continuation, handler: (@Sendable (StallEvent) -> Void)?) {
        self.continuation = continuation
        self.handler = handler
        let mark = HandlerQueueMark()
        self.mark = mark
        handlerQueue = handler.map { _ in
            let queue = DispatchQueue(label: "StallDetector.onEvent", qos: .userInitiated)
            queue.setSpecific(key: Self.handlerQueueMark, value: mark)
            return queue
        }
    }

    /// Yields `event` to the stream and hands it to the handler; after
    /// ``finish()``, does nothing.
    func publish(_ event: StallEvent) {
        continuation.yield(event)
        guard let handler, let handlerQueue else { return }
        closing.withLock { closing in
            guard closing == Self.open else { return }
            // Only enqueues (no user code under the lock).
            handlerQueue.async { [self] in
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

    /// Waits until the handler has made every call handed over so far (not
    /// from the handler itself: that would wait for itself).
    func waitForHandler() {
        guard let handlerQueue, DispatchQueue.getSpecific(key: Self.handlerQueueMark) !== mark else { return }
        handlerQueue.sync {}
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
        let fromHandler = DispatchQueue.getSpecific(key: Self.handlerQueueMark) === mark
        closing.withLock { closing in
            closing = max(closing, fromHandler ? Self.finishedFromHandler : Self.finished)
        }
        if let handlerQueue, !fromHandler {
            handlerQueue.sync {}
        }
    }
}

/// The value that marks one outlet's handler queue: compared by identity, so
/// each detector's queue is told from every other's.
private final class HandlerQueueMark: Sendable {}
