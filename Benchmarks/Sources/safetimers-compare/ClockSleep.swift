import Dispatch
import Foundation
import SafeTimers

/// `TimerClock.sleep` (one wheel entry) against `Task.sleep` on `ContinuousClock`.
enum ClockSleeps {
    /// A task sleeping 10 s on `TimerClock`, created and cancelled.
    static func timerClock(iterations: Int) -> Double {
        let clock = SystemTimerScheduler.shared.clock
        return nanosecondsPerOperation(iterations: iterations) {
            let task = Task { try? await clock.sleep(for: .seconds(10)) }
            task.cancel()
        }
    }

    /// Bytes per task suspended in a 1-hour sleep on the clock `sleep` uses,
    /// with every task asleep (measured after 1 s), then after cancelling them.
    static func bytesPerSleepingTask(count: Int, _ sleep: @escaping @Sendable () async -> Void) -> (Double, Double) {
        Parallel.settle()  // what earlier rows left to GCD frees memory meanwhile
        var tasks: [Task<Void, Never>] = []
        tasks.reserveCapacity(count)
        let before = allocatedBytes()
        for _ in 0..<count { tasks.append(Task { await sleep() }) }
        Thread.sleep(forTimeInterval: 1)
        let during = allocatedBytes()
        for task in tasks { task.cancel() }
        let done = DispatchSemaphore(value: 0)
        let all = tasks
        Task.detached {
            for task in all { await task.value }
            done.signal()
        }
        done.wait()
        tasks.removeAll(keepingCapacity: true)
        Thread.sleep(forTimeInterval: 0.2)
        let after = allocatedBytes()
        return (Double(during - before) / Double(count), Double(max(0, after - before)) / Double(count))
    }
}
