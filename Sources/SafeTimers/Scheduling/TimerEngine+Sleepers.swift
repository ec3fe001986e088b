import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// Sleepers: the tasks suspended in a sleep on an engine's clock (`TimerClock`),
// counted for `waitForSleepers(_:)` on manual engines.
extension TimerEngine {
    /// A task is now suspended in a sleep on this engine's clock (manual engines
    /// count them for ``waitForSleepers(_:)``).
    ///
    /// The caller holds the sleep's own lock, the one it armed the entry under,
    /// so the sleep's firing or cancel (which take the continuation out under
    /// that lock) can only uncount it after this counted it. Returns the waits
    /// now satisfied: the caller resumes them once it has released its lock.
    func sleeperArmed() -> [CheckedContinuation<Void, Never>] {
        guard isVirtual else { return [] }
        return lock.withLock {
            state.pointee.sleepers += 1
            let count = state.pointee.sleepers
            var ready: [CheckedContinuation<Void, Never>] = []
            for (id, wait) in state.pointee.sleeperWaiters {
                guard case .waiting(let needed, let continuation) = wait, needed <= count else { continue }
                state.pointee.sleeperWaiters[id] = nil
                ready.append(continuation)
            }
            return ready
        }
    }

    /// A sleep on this engine's clock ended (its deadline passed or it was cancelled).
    func sleeperEnded() {
        guard isVirtual else { return }
        lock.withLock { state.pointee.sleepers -= 1 }
    }

    /// Tasks suspended in a sleep on this engine's clock (manual engines).
    public var sleeperCount: Int { lock.withLock { state.pointee.sleepers } }

    /// The ``waitForSleepers(_:)`` calls that have not returned (for leak tests).
    public var sleeperWaitCount: Int { lock.withLock { state.pointee.sleeperWaiters.count } }

    /// Returns once at least `count` tasks are suspended in a sleep on this
    /// engine's clock (manual engines), or at once when the calling task is
    /// cancelled (then its registration is gone).
    public func waitForSleepers(_ count: Int) async {
        let id = lock.withLock {
            state.pointee.nextSleeperWaiter &+= 1
            state.pointee.sleeperWaiters[state.pointee.nextSleeperWaiter] = .starting
            return state.pointee.nextSleeperWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = lock.withLock { () -> Bool in
                    guard case .starting = state.pointee.sleeperWaiters[id], state.pointee.sleepers < count else {
                        state.pointee.sleeperWaiters[id] = nil
                        return true
                    }
                    state.pointee.sleeperWaiters[id] = .waiting(count: count, continuation: continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            endSleeperWait(id)
        }
    }

    /// The task of the wait `id` was cancelled: ends the wait if it is
    /// suspended, or keeps it from suspending if it has not yet; nothing if it
    /// has ended.
    private func endSleeperWait(_ id: UInt64) {
        let suspended = lock.withLock { () -> CheckedContinuation<Void, Never>? in
            switch state.pointee.sleeperWaiters[id] {
            case .starting:
                state.pointee.sleeperWaiters[id] = .cancelled
                return nil
            case .waiting(_, let continuation):
                state.pointee.sleeperWaiters[id] = nil
                return continuation
            case .cancelled, nil:
                return nil
            }
        }
        suspended?.resume()
    }
}
