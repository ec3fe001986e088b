import Dispatch
import SafeTimers

/// Arm + cancel of one one-shot timer while `pending` others of the same kind wait.
enum ArmCancel {
    static let farAway = Duration.seconds(3600)

    static func delayedWork(pending: Int, iterations: Int) -> Double {
        let keep = (0..<pending).map { _ in DelayedWork.schedule(after: farAway) {} }
        defer { for work in keep { work.cancel() } }
        return nanosecondsPerOperation(iterations: iterations) {
            let work = DelayedWork.schedule(after: .seconds(10)) {}
            work.cancel()
        }
    }

    static func asyncAfter(pending: Int, iterations: Int) -> Double {
        let queue = DispatchQueue(label: "bench.asyncAfter")
        let keep = (0..<pending).map { _ -> DispatchWorkItem in
            let item = DispatchWorkItem {}
            queue.asyncAfter(deadline: .now() + 3600, execute: item)
            return item
        }
        defer { for item in keep { item.cancel() } }
        return nanosecondsPerOperation(iterations: iterations) {
            let item = DispatchWorkItem {}
            queue.asyncAfter(deadline: .now() + 10, execute: item)
            item.cancel()
        }
    }

    static func dispatchSource(pending: Int, iterations: Int) -> Double {
        let queue = DispatchQueue(label: "bench.source")
        func make(_ seconds: Int) -> DispatchSourceTimer {
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler {}
            source.schedule(deadline: .now() + .seconds(seconds))
            source.resume()
            return source
        }
        let keep = (0..<pending).map { _ in make(3600) }
        defer { for source in keep { source.cancel() } }
        return nanosecondsPerOperation(iterations: iterations) {
            make(10).cancel()
        }
    }
}

/// One critical section guarded by a deadline: SafeTimers' `withWatchdog` and
/// the classic GCD idiom (a one-shot `DispatchSourceTimer` per section).
enum GuardedSection {
    static func watchdog(pending: Int, iterations: Int) -> Double {
        let keep = (0..<pending).map { _ in DelayedWork.schedule(after: ArmCancel.farAway) {} }
        defer { for work in keep { work.cancel() } }
        var counter = 0
        return nanosecondsPerOperation(iterations: iterations) {
            withWatchdog(timeout: .seconds(10), onTimeout: {}) { counter &+= 1 }
            blackHole(counter)
        }
    }

    static func dispatchSourceIdiom(pending: Int, iterations: Int) -> Double {
        let queue = DispatchQueue(label: "bench.watchdog")
        let keep = (0..<pending).map { _ -> DispatchSourceTimer in
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler {}
            source.schedule(deadline: .now() + 3600)
            source.resume()
            return source
        }
        defer { for source in keep { source.cancel() } }
        var counter = 0
        return nanosecondsPerOperation(iterations: iterations) {
            let source = DispatchSource.makeTimerSource(queue: queue)
            source.setEventHandler {}
            source.schedule(deadline: .now() + 10)
            source.resume()
            counter &+= 1
            source.cancel()
            blackHole(counter)
        }
    }
}

/// Bytes per pending timer, and bytes per timer still allocated after cancel.
enum Footprint {
    static func delayedWork(count: Int) -> (Double, Double) {
        memoryPerItem(
            count: count,
            make: { index in
                let payload = index
                return DelayedWork.schedule(after: ArmCancel.farAway) { blackHole(payload) }
            },
            release: { items in for item in items { item.cancel() } })
    }

    static func asyncAfter(count: Int) -> (Double, Double) {
        let queue = DispatchQueue(label: "bench.memory.asyncAfter")
        return memoryPerItem(
            count: count,
            make: { index -> DispatchWorkItem in
                let payload = index
                let item = DispatchWorkItem { blackHole(payload) }
                queue.asyncAfter(deadline: .now() + 3600, execute: item)
                return item
            },
            release: { items in for item in items { item.cancel() } })
    }

    static func dispatchSource(count: Int) -> (Double, Double) {
        let queue = DispatchQueue(label: "bench.memory.source")
        return memoryPerItem(
            count: count,
            make: { index -> DispatchSourceTimer in
                let payload = index
                let source = DispatchSource.makeTimerSource(queue: queue)
                source.setEventHandler { blackHole(payload) }
                source.schedule(deadline: .now() + 3600)
                source.resume()
                return source
            },
            release: { items in for item in items { item.cancel() } })
    }
}
