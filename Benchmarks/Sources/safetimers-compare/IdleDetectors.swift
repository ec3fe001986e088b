import Dispatch
import Foundation
import StallDetection

/// What N idle stall detectors cost, one per idle serial queue (threshold 250 ms,
/// the default 25 ms heartbeat; and with an idle heartbeat of 100 ms), against
/// the bare heartbeat: one `DispatchSourceTimer` per queue firing an empty
/// handler on the queue at the same 25 ms period. Process CPU (user + system,
/// all threads) over `seconds`.
enum IdleDetectors {
    /// Percent of one core over `seconds`, after a settling second.
    /// Also prints the process's voluntary context switches a second (its
    /// threads' wake-ups) over the same time.
    static func percentOfCore(seconds: Double, label: String) -> Double {
        Thread.sleep(forTimeInterval: 1)
        let before = ExecutorFiring.processCPUNanoseconds()
        let switchesBefore = voluntarySwitches()
        Thread.sleep(forTimeInterval: seconds)
        let switches = Double(voluntarySwitches() - switchesBefore) / seconds
        print("  \(label): \(Int(switches.rounded())) wake-ups/s")
        return Double(ExecutorFiring.processCPUNanoseconds() - before) / (seconds * 1e9) * 100
    }

    /// The process's voluntary context switches so far, all threads.
    static func voluntarySwitches() -> Int {
        var usage = rusage()
        #if os(Linux)
        getrusage(RUSAGE_SELF.rawValue, &usage)
        #else
        getrusage(RUSAGE_SELF, &usage)
        #endif
        return usage.ru_nvcsw
    }

    /// The idle heartbeat of the second row of each count.
    static let idleHeartbeat = Duration.milliseconds(100)

    static func detectors(count: Int, seconds: Double, idleHeartbeat: Duration? = nil) -> Double {
        let detectors = (0..<count).map { index in
            StallDetector(
                target: .queue(DispatchQueue(label: "idle.detector.\(index)")), threshold: .milliseconds(250),
                idleHeartbeat: idleHeartbeat)
        }
        for detector in detectors { detector.start() }
        Thread.sleep(forTimeInterval: 1)
        for detector in detectors { detector.resetLag() }
        let label = "\(count) detector(s), idle heartbeat \(detectors[0].idleHeartbeat)"
        let cost = percentOfCore(seconds: seconds, label: label)
        let probes = detectors.reduce(0) { $0 + $1.lagSnapshot().count }
        print("  \(label): \(probes) probes answered")
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
        let cost = percentOfCore(seconds: seconds, label: "\(count) bare timer(s)")
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
            let spaced = detectors(count: count, seconds: seconds, idleHeartbeat: idleHeartbeat)
            add(
                "\(count) idle StallDetector(s)", "DispatchSourceTimer per queue, empty handler", detected, bare,
                "% core")
            add(
                "\(count) idle StallDetector(s), idleHeartbeat 100 ms", "DispatchSourceTimer per queue, empty handler",
                spaced, bare, "% core")
        }
    }
}
