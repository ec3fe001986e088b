import Dispatch
import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

@MainActor
final class Label {
    var text = ""
}

@Suite("Main-actor handlers")
struct MainActorHandlerTests {
    @Test("a @MainActor DelayedWork runs on the main actor in real time, with no assumeIsolated at the call site")
    @MainActor
    func delayedWorkOnMainActor() async {
        let label = Label()
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            _ = DelayedWork.schedule(after: .milliseconds(1)) { @MainActor in
                label.text = "refreshed"
                done.resume()
            }
        }
        #expect(label.text == "refreshed")
    }

    @Test("a @MainActor RepeatingTimer and Watchdog run on the main actor in real time")
    @MainActor
    func timerAndWatchdogOnMainActor() async {
        let label = Label()
        let timerBox = TimerBox()
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let timer = RepeatingTimer(interval: .milliseconds(1), repetitions: 3) { @MainActor in
                label.text += "t"
                if label.text == "ttt" { done.resume() }
            }
            timerBox.timer = timer
            timer.start()
        }
        #expect(label.text == "ttt")
        let fired = await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
            let dog = Watchdog(timeout: .milliseconds(1)) { @MainActor in
                label.text = "late"
                done.resume(returning: true)
            }
            WatchdogKeeper.shared.keep(dog)  // alive until it fired
        }
        #expect(fired)
        #expect(label.text == "late")
    }

    @Test(
        "under a manual scheduler, a @MainActor handler runs once per tick, inline on the main thread, enqueued elsewhere"
    )
    @MainActor
    func manualOnMainThread() async {
        let manual = ManualTimerScheduler()
        let label = Label()
        let timer = RepeatingTimer(interval: .seconds(1), scheduler: manual) { @MainActor in label.text += "t" }
        timer.start()
        for second in 1...3 {
            manual.advance(by: .seconds(1))
            if !ThreadIdentity.isMainThread {
                // The main actor is not on the main thread here (the test runner
                // uses dispatchMain): the handler was enqueued on the main actor,
                // never run on the wrong thread and never trapped.
                while label.text.count < second { await Task.yield() }
            }
            #expect(label.text.count == second)
        }
        timer.cancel()
    }

    @Test("an unannotated closure still picks the queue-based overload")
    func plainClosurePicksQueueOverload() {
        let manual = ManualTimerScheduler()
        let ran = Counter()
        _ = DelayedWork.schedule(after: .seconds(1), scheduler: manual) { ran.increment() }
        manual.advance(by: .seconds(1))
        #expect(ran.count == 1, "ran inline on this (non-main) thread")
    }
}

/// Keeps watchdogs alive past the scope that created them.
final class WatchdogKeeper: Sendable {
    static let shared = WatchdogKeeper()
    private let kept = StateLock<[Watchdog]>([])
    func keep(_ dog: Watchdog) { kept.withLock { $0.append(dog) } }
}
