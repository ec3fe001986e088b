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
        if case .recorder(let recorder) = executor {
            recorder.record(target, tag: tag)
        } else if isVirtual {
            deliverVirtually(target, tag: tag, mainActor: executor.isMainActor)
        } else if _slowPath(deliveryBatch.isCollectingHere) {
            deliveryBatch.add(target, tag: tag, executor: executor, engine: self)
        } else {
            executor.run { target.invoke(tag: tag) }
        }
    }

    private func deliverVirtually(_ target: some InvocationTarget, tag: UInt64, mainActor: Bool) {
        guard mainActor else {
            enqueueDelivery { target.invoke(tag: tag) }
            return
        }
        enqueueDelivery {
            if ThreadIdentity.isMainThread || MainQueueMarker.isCurrent {
                target.invoke(tag: tag)
            } else {
                Task { @MainActor in target.invoke(tag: tag) }
            }
        }
    }
}

extension HandlerExecutor {
    /// Whether handlers run on the main actor.
    var isMainActor: Bool {
        if case .mainActor = self { return true }
        return false
    }
}
