import Dispatch
import Foundation
import StallDetection

// A stall in a process with as many threads as a server: `crowded <threads>`
// starts that many idle threads (default 256; half before the detector starts,
// half after), then stalls a serial queue 8 times for 400 ms, alternately spinning
// and asleep, each time on a thread made after every idle one (a `queue.sync`
// caller on a new thread, which runs the block itself) or on a dispatch worker
// (`queue.async`). Extra output line, one per stall:
//   CROWDED <stall> <phase> <1: the stack names crowdedBlocker, else 0> <samples> <reason or ->

/// Threads that wait forever, as a server's idle workers, event loops and
/// drivers' threads do.
func startIdleThreads(_ count: Int) {
    for _ in 0..<max(0, count) {
        let thread = Thread {
            let condition = NSCondition()
            condition.lock()
            while true { condition.wait() }
        }
        thread.stackSize = 128 * 1_024
        thread.start()
    }
}

/// 400 ms in a function whose name the report must show: spinning or asleep.
@inline(never)
func crowdedBlocker(spinning: Bool) {
    let end = ContinuousClock.now + .milliseconds(400)
    var spins = 0
    while ContinuousClock.now < end {
        if spinning { spins &+= 1 } else { usleep(10_000) }
    }
    blackHole(spins)
}

func runCrowded(threads: Int) {
    let threads = threads > 0 ? min(threads, 4_000) : 256
    startIdleThreads(threads / 2)
    let queue = DispatchQueue(label: "probe.crowded")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(150))
    let stalls = 8
    watchCrowded(detector, stalls: stalls)
    startIdleThreads(threads - threads / 2)
    Thread {
        usleep(500_000)
        for stall in 0..<stalls {
            let spinning = stall % 4 < 2
            if stall % 2 == 0 {
                let caller = Thread { queue.sync { crowdedBlocker(spinning: spinning) } }
                caller.start()
            } else {
                queue.async { crowdedBlocker(spinning: spinning) }
            }
            usleep(900_000)
        }
        usleep(2_000_000)
        emit("CROWDED timeout")
        exit(1)
    }.start()
    dispatchMain()
}

private func watchCrowded(_ detector: StallDetector, stalls: Int) {
    detector.start()
    Task.detached {
        var ended = 0
        for await event in detector.events {
            let named = event.backtrace.frames.contains { $0.function?.contains("crowdedBlocker") ?? false }
            let reason = event.backtrace.unavailableReason.map { $0.replacingOccurrences(of: " ", with: "_") } ?? "-"
            emit("CROWDED \(ended) \(event.phase.rawValue) \(named ? 1 : 0) \(event.profile.sampleCount) \(reason)")
            if !named { emit("\(event)".split(separator: "\n").map { "  | \($0)" }.joined(separator: "\n")) }
            guard event.phase == .ended else { continue }
            ended += 1
            if ended == stalls { finishAndExit(detector)() }
        }
    }
}
