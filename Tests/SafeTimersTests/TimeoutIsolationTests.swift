import SafeTimersTesting
import Testing

@testable import SafeTimers

/// State an actor owns that is not `Sendable`: only the actor's code may touch it.
private final class Ledger {
    var entries: [String] = []
}

/// An actor on a serial executor of its own, whose methods limit work that
/// touches the actor's non-`Sendable` state without naming `self`.
private actor Bookkeeper {
    let executor = QueueSerialExecutor(label: "test.bookkeeper")
    let ledger = Ledger()

    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    /// Appends to the ledger from a `withTimeout` operation that captures only
    /// locals; says whether the operation ran on the actor's executor before and
    /// after it suspended.
    func record(_ round: Int, scheduler: any TimerScheduler) async throws -> (before: Bool, after: Bool) {
        let executor = self.executor
        let ledger = self.ledger
        return try await withTimeout(.seconds(1), scheduler: scheduler) {
            let before = executor.isCurrent
            ledger.entries.append("operation \(round)")
            await Task.yield()
            ledger.entries.append("operation \(round), after a suspension")
            return (before, executor.isCurrent)
        }
    }

    /// Another job of the actor, touching the same state.
    func note() {
        ledger.entries.append("note")
    }

    /// A `withTimeout` whose operation sleeps on `scheduler`'s clock until the
    /// deadline cancels it; says where it ran and whether the caller was cancelled.
    func waitPastTheDeadline(_ manual: ManualTimerScheduler) async -> (String, onActor: Bool, callerCancelled: Bool) {
        let executor = self.executor
        let ledger = self.ledger
        let onActor = Counter()
        do {
            _ = try await withTimeout(.seconds(1), scheduler: manual) { () async throws -> Int in
                if executor.isCurrent { onActor.increment() }
                ledger.entries.append("waiting")
                try await manual.clock.sleep(for: .seconds(3600))
                return 1
            }
            return ("no timeout", onActor.count == 1, Task.isCancelled)
        } catch is TimeoutError {
            return ("timeout", onActor.count == 1, Task.isCancelled)
        } catch {
            return ("\(error)", onActor.count == 1, Task.isCancelled)
        }
    }

    var entryCount: Int { ledger.entries.count }
}

/// `withTimeout`'s operation runs in the caller's isolation, as it would inline:
/// on the caller's actor (its custom executor too) even when the closure does not
/// name `self`, and still only it is cancelled at the deadline.
@Suite("withTimeout runs its operation in the caller's isolation")
struct TimeoutIsolationTests {
    @Test("an actor's operation that captures only locals runs on the actor's executor, before and after it suspends")
    func operationWithoutSelfRunsOnTheActor() async throws {
        let manual = ManualTimerScheduler()
        let bookkeeper = Bookkeeper()
        let (before, after) = try await bookkeeper.record(0, scheduler: manual)
        #expect(before, "the operation began off the actor's executor")
        #expect(after, "the operation resumed off the actor's executor")
        #expect(await bookkeeper.entryCount == 2)
        #expect(manual.pendingCount == 0)
    }

    @Test(
        "an actor's operation touching its non-Sendable state races no other job of the actor (ThreadSanitizer)"
    )
    func operationStateIsTheActors() async throws {
        let manual = ManualTimerScheduler()
        let bookkeeper = Bookkeeper()
        let rounds = 200
        let offActor = Counter()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for round in 0..<rounds {
                group.addTask {
                    let (before, after) = try await bookkeeper.record(round, scheduler: manual)
                    if !before || !after { offActor.increment() }
                }
                group.addTask { await bookkeeper.note() }
            }
            try await group.waitForAll()
        }
        #expect(offActor.count == 0, "\(offActor.count) of \(rounds) operations ran off the actor's executor")
        #expect(await bookkeeper.entryCount == 3 * rounds)
    }

    @Test("at the deadline the actor's operation is cancelled on the actor, and the caller is not")
    func deadlineCancelsTheOperationOnTheActor() async throws {
        let manual = ManualTimerScheduler()
        let bookkeeper = Bookkeeper()
        let task = Task { await bookkeeper.waitPastTheDeadline(manual) }
        await manual.waitForSleepers(1)
        manual.advance(by: .seconds(1))
        let (outcome, onActor, callerCancelled) = await task.value
        #expect(outcome == "timeout")
        #expect(onActor)
        #expect(!callerCancelled)
        #expect(await bookkeeper.entryCount == 1)
    }
}
