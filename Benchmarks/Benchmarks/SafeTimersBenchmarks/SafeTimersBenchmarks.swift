// SafeTimers and GCD on the same work, measured by ordo-one/benchmark:
// `swift package benchmark` (from this folder). The tolerances below are on
// allocation counts only, with none allowed: compared with a stored baseline
// (`benchmark baseline update`, then `benchmark baseline check`), one extra
// allocation per operation is a regression. Wall-clock time varies from machine
// to machine and is never checked; allocations per operation do not vary.

import Benchmark
import Dispatch
import SafeTimers
import SafeTimersTesting

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        scalingFactor: .kilo,
        maxDuration: .seconds(2),
        maxIterations: 1_000
    )

    /// Allocation counts must match the stored thresholds exactly.
    let exactAllocations = Benchmark.Configuration(thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])])

    // Arm + cancel of a one-shot timer. SafeTimers allocates the handle and the
    // default queue's wrapper (the closure captures nothing); the engine's node
    // comes from its slab.
    Benchmark("arm+cancel: DelayedWork", configuration: exactAllocations) { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(DelayedWork.schedule(after: .seconds(10)) {}.cancel())
        }
    }

    Benchmark("arm+cancel: asyncAfter + DispatchWorkItem.cancel") { benchmark in
        let queue = DispatchQueue(label: "benchmark.asyncAfter")
        for _ in benchmark.scaledIterations {
            let item = DispatchWorkItem {}
            queue.asyncAfter(deadline: .now() + 10, execute: item)
            item.cancel()
        }
    }

    // A critical section guarded by a deadline: withWatchdog allocates the
    // watchdog and its engine entry; GCD's idiom creates a timer source per section.
    Benchmark("guarded section: withWatchdog", configuration: exactAllocations) { benchmark in
        var counter = 0
        for _ in benchmark.scaledIterations {
            withWatchdog(timeout: .seconds(10), onTimeout: {}) { counter &+= 1 }
        }
        blackHole(counter)
    }

    Benchmark("guarded section: DispatchSourceTimer per section") { benchmark in
        let queue = DispatchQueue(label: "benchmark.watchdog")
        for _ in benchmark.scaledIterations {
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler {}
            source.schedule(deadline: .now() + 10)
            source.resume()
            source.cancel()
        }
    }

    // Virtual time: one hour of a 30 s timer per operation (120 handler calls).
    Benchmark(
        "ManualTimerScheduler: 1 h of a 30 s timer",
        configuration: .init(scalingFactor: .one, thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])])
    ) { benchmark in
        for _ in benchmark.scaledIterations {
            let manual = ManualTimerScheduler()
            let timer = RepeatingTimer(interval: .seconds(30), scheduler: manual) {}
            timer.start()
            manual.advance(by: .seconds(3600))
            blackHole(timer.fireCount)
            timer.cancel()
        }
    }
}
