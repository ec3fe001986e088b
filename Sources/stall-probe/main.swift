// A child process for StallDetection's integration tests and measurements: each
// scenario sets up a detector, blocks its target in a uniquely named function,
// and prints one line per fact:
//   EVENT <id> <phase> <duration_ms> <base64 of the report>
//   REAL <duration_ms>        how long a block really took
//   READY                     the scenario is running (for tests that signal it)
//   SAMPLING <ms>             how long sampling and symbolicating a stall took
//   CPU <user+system ms>      the detector process' CPU time at the end
// Not a product: tests run it from the build folder.

import Dispatch
import Foundation
import StallDetection

let arguments = CommandLine.arguments.dropFirst()
guard let scenario = arguments.first else {
    print("usage: stall-probe queue|runloop|mainqueue-runloop|mainqueue-dispatchmain|busy|idle|recall|overhead [N]")
    exit(2)
}
let number = arguments.dropFirst().first.flatMap { Int($0) } ?? 600

switch scenario {
case "queue":
    let queue = DispatchQueue(label: "probe.serial")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    queue.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedQueueBlocker(number) }
    dispatchMain()

case "runloop", "mainqueue-runloop":
    let detector = StallDetector(
        target: scenario == "runloop" ? .mainRunLoop : .mainQueue, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedMainThreadBlocker(number) }
    RunLoop.main.run()

case "mainqueue-dispatchmain":
    let detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250))
    watch(detector, endedCount: 1, then: finishAndExit(detector))
    DispatchQueue.main.asyncAfter(deadline: .now() + 0.3) { uniquelyNamedMainThreadBlocker(number) }
    dispatchMain()

case "busy":
    // Many short blocks for `number` seconds: busy, never blocked.
    let queue = DispatchQueue(label: "probe.busy")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    detector.start()
    Task.detached { for await event in detector.events { report(event) } }
    let end = ContinuousClock.now + .seconds(number)
    while ContinuousClock.now < end {
        for _ in 0..<50 { queue.async { usleep(2_000) } }
        queue.sync {}
    }
    finishAndExit(detector)()

case "idle", "overhead":
    // A detector on an idle queue for `number` seconds (tests stop and continue
    // this process meanwhile; the overhead measurement reads the CPU line).
    let queue = DispatchQueue(label: "probe.idle")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250), heartbeat: .milliseconds(50))
    detector.start()
    Task.detached { for await event in detector.events { report(event) } }
    emit("READY")
    if scenario == "overhead" { usleep(2_000_000) }  // the detector's one-time warm-up is not overhead
    let before = cpuMilliseconds()
    usleep(UInt32(number) * 1_000_000)
    detector.stop()
    emit("CPU \(cpuMilliseconds() - before)")
    exit(0)

case "recall":
    // 20 stalls of random length between 300 ms and 1.5 s, one second apart.
    let queue = DispatchQueue(label: "probe.recall")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    watch(detector, endedCount: 20, then: finishAndExit(detector))
    var generator = SystemRandomNumberGenerator()
    let lengths = (0..<20).map { _ in Int.random(in: 300...1500, using: &generator) }
    // Each stall is its own block, with the queue free in between.
    Thread {
        usleep(300_000)
        for length in lengths {
            queue.sync { uniquelyNamedQueueBlocker(length) }
            usleep(400_000)
        }
    }.start()
    dispatchMain()

default:
    print("unknown scenario \(scenario)")
    exit(2)
}
