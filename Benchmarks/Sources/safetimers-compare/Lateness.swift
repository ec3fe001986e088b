import Dispatch
import Foundation
import NIOCore
import NIOPosix
import SafeTimers
import Synchronization

/// Firing lateness: `count` one-shot timers due at evenly spread instants 1–2 s
/// after the start, each recording how late its handler began.
///
/// Every mechanism gets the same deadlines, read on the same monotonic clock, and
/// runs its handlers where users would: SafeTimers and GCD on the global
/// concurrent queue, swift-nio on its event loop, `Task.sleep` on the cooperative
/// pool.
enum Lateness {
    struct Percentiles {
        var p50: Double
        var p99: Double
        var max: Double
        /// How many timers fired before their deadline.
        var early: Int
    }

    /// Collects one lateness per timer, from any thread.
    final class Recorder: @unchecked Sendable {
        // `@unchecked Sendable` invariant: timer `i` writes only `samples[i]`, once;
        // `wait()` reads them only after every timer counted itself done.
        static let notFired = Int64.min
        let samples: UnsafeMutableBufferPointer<Int64>
        let deadlines: [Int64]
        private let done = Atomic<Int>(0)
        private let finished = DispatchSemaphore(value: 0)

        /// `burst`: every timer is due at the same instant, 1 s after the start.
        init(count: Int, burst: Bool = false) {
            // Not while GCD still works off what an earlier row left (the
            // scaling rows' cancelled sources): that put 1.4 ms on this row's p50.
            Parallel.settle()
            let start = monotonicNanoseconds()
            samples = .allocate(capacity: count)
            samples.initialize(repeating: Self.notFired)
            let step = burst ? 0 : 1_000_000_000 / Int64(count)
            deadlines = (0..<count).map { start + 1_000_000_000 + Int64($0) * step }
        }

        deinit { samples.deallocate() }

        /// Nanoseconds from now until timer `index` is due.
        func delay(_ index: Int) -> Int64 { deadlines[index] - monotonicNanoseconds() }

        func fired(_ index: Int) {
            samples[index] = monotonicNanoseconds() - deadlines[index]
            if done.add(1, ordering: .acquiringAndReleasing).newValue == samples.count { finished.signal() }
        }

        func wait() -> Percentiles {
            _ = finished.wait(timeout: .now() + 20)
            var sorted = samples.filter { $0 != Self.notFired }.sorted()
            let early = sorted.prefix { $0 < 0 }.count
            if sorted.count < samples.count {
                // A timer that never fired counts as infinitely late.
                sorted += Array(repeating: Int64.max, count: samples.count - sorted.count)
            }
            func at(_ fraction: Double) -> Double {
                Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]) / 1_000
            }
            return Percentiles(p50: at(0.5), p99: at(0.99), max: Double(sorted.last!) / 1_000, early: early)
        }
    }

    static func delayedWork(count: Int, burst: Bool = false) -> Percentiles {
        let recorder = Recorder(count: count, burst: burst)
        let works = (0..<count).map { index in
            DelayedWork.schedule(after: .nanoseconds(recorder.delay(index))) { recorder.fired(index) }
        }
        defer { withExtendedLifetime(works) {} }
        return recorder.wait()
    }

    static func asyncAfter(count: Int, burst: Bool = false) -> Percentiles {
        let recorder = Recorder(count: count, burst: burst)
        for index in 0..<count {
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(recorder.delay(index)))) {
                recorder.fired(index)
            }
        }
        return recorder.wait()
    }

    static func dispatchSource(count: Int, burst: Bool = false) -> Percentiles {
        let recorder = Recorder(count: count, burst: burst)
        let sources = (0..<count).map { index -> DispatchSourceTimer in
            let source = DispatchSource.makeTimerSource(queue: .global())
            source.setEventHandler { recorder.fired(index) }
            source.schedule(deadline: .now() + .nanoseconds(Int(recorder.delay(index))), leeway: .nanoseconds(0))
            source.resume()
            return source
        }
        let result = recorder.wait()
        for source in sources { source.cancel() }
        return result
    }

    static func taskSleep(count: Int) -> Percentiles {
        let recorder = Recorder(count: count)
        for index in 0..<count {
            Task {
                try? await Task.sleep(for: .nanoseconds(recorder.delay(index)))
                recorder.fired(index)
            }
        }
        return recorder.wait()
    }

    static func nio(count: Int, burst: Bool = false) -> Percentiles {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let loop = group.next()
        let recorder = Recorder(count: count, burst: burst)
        try! loop.submit {
            for index in 0..<count {
                loop.scheduleTask(in: .nanoseconds(recorder.delay(index))) { recorder.fired(index) }
            }
        }.wait()
        return recorder.wait()
    }
}

func monotonicNanoseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
}
