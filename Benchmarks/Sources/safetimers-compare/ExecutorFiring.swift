import Dispatch
import Foundation
import NIOCore
import NIOPosix
import SafeTimers
import Synchronization

/// What one firing costs when its handler must run on a SwiftNIO event loop:
/// SafeTimers with `executor: loop.executor` (a task started directly on the
/// loop), SafeTimers with `queue:` (a serial dispatch queue), and NIO's own
/// `scheduleTask` on the loop. Every timer is armed from this (non-loop) thread,
/// the way a request's timeout is armed by code that is not on the loop, and
/// the figure is the process's CPU time (user + system, every thread) from the
/// first arming to the last handler, per firing.
enum ExecutorFiring {
    enum Target {
        case executor, queue, nio
    }

    /// `count` timers, all due `spread` apart starting 2 ms after the first is
    /// armed (`spread` zero: all due together).
    static func cpuPerFiring(_ target: Target, count: Int, spread: Duration) -> Double {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let loop = group.next()
        let queue = DispatchQueue(label: "firing.serial")
        let fired = Atomic<Int>(0)
        let done = DispatchSemaphore(value: 0)
        let handler: @Sendable () -> Void = {
            if fired.add(1, ordering: .relaxed).newValue == count { done.signal() }
        }
        let spreadNanoseconds =
            spread.components.seconds * 1_000_000_000 + spread.components.attoseconds / 1_000_000_000
        let began = processCPUNanoseconds()
        let start = SystemTimerScheduler.shared.clock.now.advanced(by: .milliseconds(2))
        let nioStart = NIODeadline.now() + .milliseconds(2)
        var works: [DelayedWork] = []
        works.reserveCapacity(count)
        for index in 0..<count {
            let offset = Int64(index) * spreadNanoseconds
            switch target {
            case .executor:
                works.append(
                    DelayedWork.schedule(at: start.advanced(by: .nanoseconds(offset)), executor: loop.executor, handler)
                )
            case .queue:
                works.append(DelayedWork.schedule(at: start.advanced(by: .nanoseconds(offset)), on: queue, handler))
            case .nio:
                loop.scheduleTask(deadline: nioStart + .nanoseconds(offset), handler)
            }
        }
        done.wait()
        let spent = processCPUNanoseconds() - began
        withExtendedLifetime(works) {}
        return Double(spent) / Double(count)
    }

    static func processCPUNanoseconds() -> Int64 {
        var usage = rusage()
        #if os(Linux)
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        #else
        getrusage(RUSAGE_SELF, &usage)
        #endif
        let user = Int64(usage.ru_utime.tv_sec) * 1_000_000_000 + Int64(usage.ru_utime.tv_usec) * 1_000
        let system = Int64(usage.ru_stime.tv_sec) * 1_000_000_000 + Int64(usage.ru_stime.tv_usec) * 1_000
        return user + system
    }
}
