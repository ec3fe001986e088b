import Dispatch
import Foundation
import StallDetection

/// What N idle stall detectors cost, one per idle serial queue (threshold 250 ms,
/// the default 25 ms heartbeat), against the bare heartbeat: one
/// `DispatchSourceTimer` per queue firing an empty handler on the queue at the
/// same period. Process CPU (user + system, all threads) over `seconds`.
enum IdleDetectors {
    /// Percent of one core over `seconds`, after a settling second.
    static func percentOfCore(seconds: Double) -> Double {
        Thread.sleep(forTimeInterval: 1)
        let before = ExecutorFiring.processCPUNanoseconds()
        Thread.sleep(forTimeInterval: seconds)
        return Double(ExecutorFiring.processCPUNanoseconds() - before) / (seconds * 1e9) * 100
    }

    static func detectors(count: Int, seconds: Double) -> Double {
        let detectors = (0..<count).map { index in
            StallDetector(target: .queue(DispatchQueue(label: "idle.detector.\(index)")), threshold: .milliseconds(250))
        }
        for detector in detectors { detector.start() }
        let cost = percentOfCore(seconds: seconds)
        for detector in detectors { detector.stop() }
        return cost
    }

    static func bareHeartbeat(count: Int, seconds: Double) -> Double {
        let timers = (0..<count).map { index in
            let timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "idle.bare.\(index)"))
            timer.schedule(deadline: .now() + .milliseconds(25), repeating: .milliseconds(25))
            timer.setEventHandler {}
            timer.resume()
            return timer
        }
        let cost = percentOfCore(seconds: seconds)
        for timer in timers { timer.cancel() }
        return cost
    }

    /// One row a detector count: detectors against the bare heartbeat, in one run.
    @MainActor
    static func addRows(counts: [Int], seconds: Double) {
        // The first detector's one-time warm-up (symbol tables read, and freed
        // again when the worker that read them retires) is not idle cost.
        _ = detectors(count: 1, seconds: 6)
        for count in counts {
            let bare = bareHeartbeat(count: count, seconds: seconds)
            let detected = detectors(count: count, seconds: seconds)
            add(
                "\(count) idle StallDetector(s)", "DispatchSourceTimer per queue, empty handler", detected, bare,
                "% core")
        }
    }
}
