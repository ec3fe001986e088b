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

/// Starts a thread that runs `body` (which must end up asleep in the kernel) and
/// returns its id once it sleeps (or after 2 s).
func startSleepingThread(stackSize: Int = 8 << 20, _ body: @escaping @Sendable () -> Void) -> Int32 {
    let tid = Locked<Int32>(0)
    let thread = Thread {
        tid.withLock { $0 = stallcapture_current_tid() }
        body()
    }
    thread.stackSize = stackSize
    thread.start()
    var target: Int32 = 0
    for _ in 0..<400 where target == 0 || !ThreadState.isAsleep(thread: target) {
        usleep(5_000)
        target = tid.withLock { $0 }
    }
    return target
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
        defer { done.withLock { $0 = true } }
        let target = startSleepingThread { kernelSampleCaller(done) }
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

@Suite("Which threads are signalled")
struct SignalOrderTests {
    @Test("sleeping threads are tried before running ones; a running thread in user code before one in the kernel")
    func sleepersFirst() throws {
        let stop = Locked(false)
        let ids = Locked<[String: Int32]>([:])
        func start(_ name: String, _ body: @escaping @Sendable () -> Void) {
            Thread {
                ids.withLock { $0[name] = stallcapture_current_tid() }
                while !stop.withLock({ $0 }) { body() }
            }.start()
        }
        defer { stop.withLock { $0 = true } }
        start("sleeper") { usleep(20_000) }
        start("spinner") {
            var x = 0
            for i in 0..<1_000_000 { x &+= i }
            blackHoleForTests(x)
        }
        start("reader") {
            let descriptor = open("/dev/zero", O_RDONLY)
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: 64 << 20, alignment: 16)
            _ = read(descriptor, buffer, 64 << 20)
            buffer.deallocate()
            close(descriptor)
        }
        for _ in 0..<200 where ids.withLock({ $0.count }) < 3 { usleep(5_000) }
        usleep(300_000)  // let the running threads accumulate user and kernel time
        let named = ids.withLock { $0 }
        let (sleeper, spinner, reader) = (named["sleeper"]!, named["spinner"]!, named["reader"]!)
        var ordered = false
        // The states change from moment to moment: one ordering as expected is enough.
        for _ in 0..<50 where !ordered {
            let order = SamplingContext.sleepersFirst([reader, spinner, sleeper])
            ordered = order == [sleeper, spinner, reader]
            usleep(10_000)
        }
        #expect(ordered)
    }
}

@inline(never) func blackHoleForTests(_ value: Int) { if value == 42 { print("") } }
