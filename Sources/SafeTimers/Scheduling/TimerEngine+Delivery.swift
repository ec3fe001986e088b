/// How an invocation reaches its executor: decided here, by the engine, for every
/// primitive (a primitive only says which executor its handler belongs to).
extension TimerEngine {
    /// Hands the invocation queued as `tag` to `executor`.
    ///
    /// - A manual (virtual) engine queues it, and it runs inside the next (or
    ///   current) `advance`, on the advancing thread, so tests need no waiting and
    ///   no handler runs anywhere else; a main-actor handler runs there only when
    ///   that thread is the main thread, and is otherwise enqueued on the main
    ///   actor (it never traps).
    /// - On the scheduler thread of a real-time engine, while it fires a round of
    ///   due entries, the invocation is collected, and goes out with the others
    ///   due together for the same destination (see ``DeliveryBatch``).
    /// - Otherwise the executor runs it (``HandlerExecutor/run(_:)``).
    @inline(__always)
    func deliver(_ target: some InvocationTarget, tag: UInt64, to executor: HandlerExecutor) {
        if isVirtual {
            deliverVirtually(target, tag: tag, to: executor)
        } else if _slowPath(deliveryBatch.isCollectingHere) {
            deliveryBatch.add(target, tag: tag, executor: executor)
        } else {
            executor.run { target.invoke(tag: tag) }
        }
    }

    /// A manual engine's delivery: queued for `advance`, or, for a test's
    /// recorder (virtual engines only), recorded for the test to begin.
    private func deliverVirtually(_ target: some InvocationTarget, tag: UInt64, to executor: HandlerExecutor) {
        switch executor {
        case .recorder(let recorder):
            recorder.record(target, tag: tag)
        case .mainActor:
            enqueueDelivery {
                if ThreadIdentity.isMainThread || MainQueueMarker.isCurrent {
                    target.invoke(tag: tag)
                } else {
                    Task { @MainActor in target.invoke(tag: tag) }
                }
            }
        default:
            enqueueDelivery { target.invoke(tag: tag) }
        }
    }
}
