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
    /// Set by ``finish()``: a call handed over before it and not begun is dropped.
    private let finished = Atomic<Bool>(false)

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

    /// Yields `event` to the stream and hands it to the handler.
    func publish(_ event: StallEvent) {
        continuation.yield(event)
        guard let handler, let handlerQueue else { return }
        handlerQueue.async { [self] in
            if !finished.load(ordering: .acquiring) { handler(event) }
        }
    }

    /// Ends the stream; calls handed to the handler and not begun are dropped,
    /// and a call in progress is waited for (unless this is called from this
    /// outlet's handler; from another detector's handler it waits): once it
    /// returns, the handler is not running (on another thread) and is not called
    /// again. Called once nothing more is published.
    func finish() {
        continuation.finish()
        finished.store(true, ordering: .releasing)
        if let handlerQueue, DispatchQueue.getSpecific(key: Self.handlerQueueMark) !== mark {
            handlerQueue.sync {}
        }
    }
}

/// The value that marks one outlet's handler queue: compared by identity, so
/// each detector's queue is told from every other's.
private final class HandlerQueueMark: Sendable {}
