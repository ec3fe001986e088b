import Dispatch
import Foundation
import NIOCore
import NIOPosix
@_spi(SchedulerImplementation) import SafeTimers

/// Context switches per second of the whole process while `count` timers wait an
/// hour away and nothing else happens: what an idle timer service costs the
/// machine. Read from getrusage (voluntary + involuntary, all threads).
enum IdleWakeUps {
    static let window = 2.0

    static func contextSwitches() -> Int {
        var usage = rusage()
        #if canImport(Darwin)
        getrusage(RUSAGE_SELF, &usage)
        #else
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        #endif
        return usage.ru_nvcsw + usage.ru_nivcsw
    }

    /// Switches per second over `window` seconds after a settling second.
    static func measure() -> Double {
        Thread.sleep(forTimeInterval: 1)
        let before = contextSwitches()
        Thread.sleep(forTimeInterval: window)
        // Our own two sleeps are two voluntary switches of this thread.
        return Double(max(0, contextSwitches() - before - 1)) / window
    }

    static func delayedWork(count: Int) -> (perSecond: Double, engineWakeUps: Double) {
        let works = (0..<count).map { _ in DelayedWork.schedule(after: .seconds(3600)) {} }
        let engine = SystemTimerScheduler.shared.engine
        Thread.sleep(forTimeInterval: 1)
        let wakeUpsBefore = engine.wakeUpCount
        let switches = measure()
        let wakeUps = Double(engine.wakeUpCount - wakeUpsBefore) / (window + 1)
        for work in works { work.cancel() }
        return (switches, wakeUps)
    }

    static func asyncAfter(count: Int) -> Double {
        let items = (0..<count).map { _ -> DispatchWorkItem in
            let item = DispatchWorkItem {}
            DispatchQueue.global().asyncAfter(deadline: .now() + 3600, execute: item)
            return item
        }
        let result = measure()
        for item in items { item.cancel() }
        return result
    }

    static func nio(count: Int) -> Double {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let loop = group.next()
        let tasks = try! loop.submit { (0..<count).map { _ in loop.scheduleTask(in: .hours(1)) {} } }.wait()
        let result = measure()
        try! loop.submit { for task in tasks { task.cancel() } }.wait()
        return result
    }
}
