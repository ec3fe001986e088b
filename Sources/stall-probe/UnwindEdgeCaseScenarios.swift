import Dispatch
import Foundation
import StallDetection

#if canImport(Glibc)
import Glibc
#endif

// The signal sampler's unwinding and naming at its edges (no `backtrace()` in the handler).
// `unwind-merged`: a 600 ms stall in `mergedBodySecond`, whose body is the same as
// `mergedBodyFirst`'s (a release build merges the two into one function, named
// after one of them), called from `mergedBodySecondCaller`. Extra output lines:
//   FREE <bytes>      the stack left below the spinning frame when the stall began

/// The scenarios this file runs.
let unwindEdgeCaseScenarios: Set<String> = [
    "unwind-near-stack-end", "unwind-near-stack-end-alone", "unwind-merged",
]

func runUnwindEdgeCaseScenario(_ scenario: String, _ number: Int) {
    let queue = DispatchQueue(label: "probe.unwind")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    defer { withExtendedLifetime(detector) {} }
    switch scenario {
    case "unwind-near-stack-end":
        // The stalled job recurses until only `number` bytes of its thread's stack
        // are left below it, then spins for 1.5 s: the detector's first signal
        // sample of the process lands there. (The program alone never overflows.)
        watch(detector, endedCount: 1, then: finishAndExit(detector))
        queue.asyncAfter(deadline: .now() + 0.3) {
            emit("FREE \(unwindEdgeCaseDescend(low: unwindEdgeCaseStackLow(), left: UInt(max(number, 0))))")
        }
        dispatchMain()
    case "unwind-near-stack-end-alone":
        // The same job without a detector: the program alone does not overflow.
        queue.asyncAfter(deadline: .now() + 0.3) {
            emit("FREE \(unwindEdgeCaseDescend(low: unwindEdgeCaseStackLow(), left: UInt(max(number, 0))))")
            exit(0)
        }
        dispatchMain()
    case "unwind-merged":
        watch(detector, endedCount: 1, then: finishAndExit(detector))
        _ = mergedBodyFirst(0)
        queue.asyncAfter(deadline: .now() + 0.3) { _ = mergedBodySecondCaller(600) }
        dispatchMain()
    default:
        break
    }
}

/// Sleeps in 5 ms steps for `milliseconds`; returns the steps. The same body as
/// ``mergedBodySecond(_:)``.
@inline(never)
func mergedBodyFirst(_ milliseconds: Int) -> Int {
    let end = ContinuousClock.now + .milliseconds(milliseconds)
    var steps = 0
    while ContinuousClock.now < end {
        usleep(5_000)
        steps += 1
    }
    return steps
}

/// The same body as ``mergedBodyFirst(_:)``.
@inline(never)
func mergedBodySecond(_ milliseconds: Int) -> Int {
    let end = ContinuousClock.now + .milliseconds(milliseconds)
    var steps = 0
    while ContinuousClock.now < end {
        usleep(5_000)
        steps += 1
    }
    return steps
}

@inline(never)
func mergedBodySecondCaller(_ milliseconds: Int) -> Int {
    mergedBodySecond(milliseconds) + 1
}

/// The lowest address of the mapping that holds the calling thread's stack
/// pointer (from `/proc/self/maps`: a thread's stack is one mapping, with its
/// guard page a separate one below).
@inline(never)
func unwindEdgeCaseStackLow() -> UInt {
    var marker = 0
    let here = withUnsafeMutablePointer(to: &marker) { UInt(bitPattern: $0) }
    let maps = (try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8)) ?? ""
    for line in maps.split(separator: "\n") {
        let range = line.split(separator: " ").first?.split(separator: "-") ?? []
        guard range.count == 2, let start = UInt(range[0], radix: 16), let end = UInt(range[1], radix: 16) else {
            continue
        }
        if start <= here && here < end { return start }
    }
    return here
}

/// Recurses until less than `left` bytes of stack remain above `low`, then spins;
/// returns how many were left there.
@inline(never)
func unwindEdgeCaseDescend(low: UInt, left: UInt) -> UInt {
    var marker = 0
    let here = withUnsafeMutablePointer(to: &marker) { UInt(bitPattern: $0) }
    if here > low + left + 256 {
        let free = unwindEdgeCaseDescend(low: low, left: left)
        withExtendedLifetime(marker) {}
        return free
    }
    unwindEdgeCaseNearStackEndSpin()
    return here - low
}

@inline(never)
func unwindEdgeCaseNearStackEndSpin() {
    let end = ContinuousClock.now + .milliseconds(1_500)
    var spins = 0
    while ContinuousClock.now < end { spins &+= 1 }
    if spins == 42 { print(spins) }
}
