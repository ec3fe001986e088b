import Dispatch
import Foundation
import StallDetection
import Synchronization

/// `stop-at-stall-end <seconds> [lanes]`: `lanes` threads each run cycles of
/// one detector (threshold 50 ms, heartbeat 5 ms) on a queue blocked 90 ms,
/// and call `stop()` the moment the block ends, when the probe's answer is
/// ending the stall. A cycle whose handler got `.started` must have had its
/// `.ended` (as the stall's own end or cut short by the stop) when `stop()`
/// returned. Prints `STOPRACE <cycles> <with .started> <.ended lost>`.
func runStopAtStallEnd(seconds: Int, lanes: Int) {
    let cycles = Atomic<Int>(0)
    let started = Atomic<Int>(0)
    let lost = Atomic<Int>(0)
    let end = DispatchTime.now() + .seconds(seconds)
    let group = DispatchGroup()
    for lane in 0..<lanes {
        group.enter()
        Thread.detachNewThread {
            while DispatchTime.now() < end {
                let (sawStarted, sawEnded) = stopAtStallEndCycle(lane: lane)
                cycles.add(1, ordering: .relaxed)
                if sawStarted { started.add(1, ordering: .relaxed) }
                if sawStarted && !sawEnded { lost.add(1, ordering: .relaxed) }
            }
            group.leave()
        }
    }
    group.wait()
    emit(
        "STOPRACE \(cycles.load(ordering: .relaxed)) \(started.load(ordering: .relaxed)) \(lost.load(ordering: .relaxed))"
    )
    exit(0)
}

/// One cycle: whether the handler got a `.started`, and an `.ended` of the
/// same stall, by the time `stop()` returned.
private func stopAtStallEndCycle(lane: Int) -> (started: Bool, ended: Bool) {
    let queue = DispatchQueue(label: "probe.stoprace.\(lane)")
    let phases = Mutex<[(UInt64, StallEvent.Phase)]>([])
    let detector = StallDetector(
        target: .queue(queue), threshold: .milliseconds(50), heartbeat: .milliseconds(5)
    ) { event in
        phases.withLock { $0.append((event.id, event.phase)) }
    }
    detector.start()
    usleep(20_000)
    let blockEnded = DispatchSemaphore(value: 0)
    queue.async {
        usleep(90_000)
        blockEnded.signal()
    }
    blockEnded.wait()
    detector.stop()
    let seen = phases.withLock { $0 }
    guard let first = seen.first(where: { $0.1 == .started }) else { return (false, false) }
    return (true, seen.contains { $0.0 == first.0 && $0.1 == .ended })
}
