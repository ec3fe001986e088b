import CStallCapture
import Foundation
import Testing

@testable import StallDetection

/// Leaves stale return addresses and frame records below the stack pointer of a
/// later call, as any real program does.
@inline(never)
func kernelSampleLeaveStaleFrames() -> Int {
    (0..<64).map { String($0) }.joined().count
}

@inline(never)
func kernelSampleSleeper(_ done: Locked<Bool>) {
    _ = kernelSampleLeaveStaleFrames()
    while !done.withLock({ $0 }) { usleep(50_000) }
    _ = kernelSampleLeaveStaleFrames()
}

@inline(never)
func kernelSampleCaller(_ done: Locked<Bool>) {
    kernelSampleSleeper(done)
    _ = kernelSampleLeaveStaleFrames()
}

@Suite(
    "Sampling a thread asleep in the kernel (in process)",
    .disabled(
        if: underThreadSanitizer,
        "ThreadSanitizer's interceptors (without frame pointers) sit between the program and libc"))
struct KernelSampleTests {
    @Test("no signal; the sleeper and its caller in order, no stale or uncertain frame, down to start_thread")
    func sleepingThread() throws {
        let done = Locked(false)
        let tid = Locked<Int32>(0)
        let thread = Thread {
            tid.withLock { $0 = stallcapture_current_tid() }
            kernelSampleCaller(done)
        }
        thread.start()
        defer { done.withLock { $0 = true } }
        var target: Int32 = 0
        for _ in 0..<200 where target == 0 || !ThreadState.isAsleep(thread: target) {
            usleep(5_000)
            target = tid.withLock { $0 }
        }
        let context = SamplingContext()
        // Several samples: each must be whole, whenever it lands.
        for _ in 0..<5 {
            let backtrace = context.backtrace(of: target)
            let names = backtrace.frames.map { $0.function ?? "?" }
            let sleeper = try #require(names.firstIndex { $0.hasPrefix("kernelSampleSleeper") }, "\(backtrace)")
            try #require(sleeper + 1 < names.count, "\(backtrace)")
            #expect(names[sleeper + 1].hasPrefix("kernelSampleCaller"), "\(backtrace)")
            #expect(
                names[..<sleeper].allSatisfy { !$0.contains("kernelSample") }, "nothing stale above: \(backtrace)")
            #expect(!backtrace.frames.contains { $0.isUncertain }, "\(backtrace)")
            #expect(names.last == "start_thread" || names.contains("start_thread"), "\(backtrace)")
            usleep(20_000)
        }
    }
}
