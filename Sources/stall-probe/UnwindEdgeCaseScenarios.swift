import Dispatch
import Foundation
import StallDetection

#if canImport(Glibc)
import Glibc
#endif

// The signal sampler's unwinding at its edges (no `backtrace()` in the handler). Extra output lines:
//   FREE <bytes>      the stack left below the spinning frame when the stall began

/// The scenarios this file runs.
let unwindEdgeCaseScenarios: Set<String> = ["unwind-near-stack-end", "unwind-near-stack-end-alone"]

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
    default:
        break
    }
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
