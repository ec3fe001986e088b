import CStallCapture
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc
#endif

// The sampler's promises at their edges (kept-open /proc files,
// code cached across samples, rwx mappings not treated as code, images loaded
// after the first sample).

#if os(Linux) && arch(x86_64)

/// Released by a test to let its blocked thread return (one test at a time: the
/// suite is serialized).
private let samplerEdgeCaseGate = Atomic<Int>(0)

/// The callee a JIT stub or a test library calls: sleeps in the kernel until the gate opens.
private let samplerEdgeCaseSleeper: @convention(c) () -> Void = {
    while samplerEdgeCaseGate.load(ordering: .acquiring) == 0 { usleep(2_000) }
}

/// The same, but running in user code (sampled by signal).
private let samplerEdgeCaseSpinner: @convention(c) () -> Void = {
    var spins = 0
    while samplerEdgeCaseGate.load(ordering: .acquiring) == 0 { spins &+= 1 }
    _ = spins
}

/// Calls a C function `code(callback)` or `code()`; its own frame must stay in reports.
@inline(never)
private func samplerEdgeCaseCaller(_ code: UInt, callback: UInt?) {
    if let callback {
        let function = unsafeBitCast(code, to: (@convention(c) (UInt) -> Void).self)
        function(callback)
    } else {
        let function = unsafeBitCast(code, to: (@convention(c) () -> Void).self)
        function()
    }
}

/// A thread running `body`, whose kernel id and a stack address it publishes.
private final class SamplerEdgeCaseThread: @unchecked Sendable {
    // Invariant: `tid` and `stackMarker` are written once by the thread before
    // `ready` is signalled, and read only after `ready` was waited for.
    private(set) var tid: Int32 = 0
    private(set) var stackMarker: UInt = 0
    private let ready = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)

    init(stackSize: Int? = nil, _ body: @escaping @Sendable () -> Void) {
        let thread = Thread { [self] in
            var local = 0
            withUnsafeMutablePointer(to: &local) { stackMarker = UInt(bitPattern: $0) }
            tid = stallcapture_current_tid()
            ready.signal()
            body()
            done.signal()
        }
        if let stackSize { thread.stackSize = stackSize }
        thread.start()
        ready.wait()
        // Let it reach its blocking point.
        usleep(50_000)
    }

    /// Waits for the body to return (true) or gives up after `seconds`.
    func join(seconds: Double = 10) -> Bool { done.wait(timeout: .now() + seconds) == .success }
}

/// The `/proc/self/task/TID/{stat,syscall}` descriptors open in this process, by tid.
private func samplerEdgeCaseTaskDescriptors() -> [Int32: Int] {
    var counts: [Int32: Int] = [:]
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return [:] }
    for entry in entries {
        var buffer = [CChar](repeating: 0, count: 512)
        let count = readlink("/proc/self/fd/\(entry)", &buffer, buffer.count - 1)
        guard count > 0 else { continue }
        let target = String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let parts = target.split(separator: "/")
        // /proc/PID/task/TID/stat
        guard parts.count == 5, parts[0] == "proc", parts[2] == "task", parts[4] == "stat" || parts[4] == "syscall",
            let tid = Int32(parts[3])
        else { continue }
        counts[tid, default: 0] += 1
    }
    return counts
}

/// Builds a shared library from C source with the system compiler (`-O1` unless
/// `flags` are given, frame pointers kept); its path, or nil when there is no compiler.
func samplerEdgeCaseBuildLibrary(
    named name: String, source: String, flags: [String] = ["-O1", "-fno-omit-frame-pointer"]
) -> String? {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
        "sampler-attack-\(name)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
    try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let sourcePath = directory.appendingPathComponent("\(name).c").path
    let libraryPath = directory.appendingPathComponent("lib\(name).so").path
    guard FileManager.default.createFile(atPath: sourcePath, contents: Data(source.utf8)) else { return nil }
    for compiler in ["/usr/bin/cc", "/usr/bin/gcc", "/opt/swift/usr/bin/clang"]
    where FileManager.default.isExecutableFile(atPath: compiler) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: compiler)
        process.arguments = ["-shared", "-fPIC"] + flags + ["-o", libraryPath, sourcePath]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { continue }
        process.waitUntilExit()
        if process.terminationStatus == 0 { return libraryPath }
    }
    return nil
}

/// Two functions that keep their frames (`outer` calls `inner` calls the callback).
private func samplerEdgeCaseLibrarySource(_ prefix: String) -> String {
    """
    typedef void (*callback_t)(void);
    __attribute__((noinline)) void \(prefix)_inner(callback_t callback) {
        callback();
        __asm__ volatile("" ::: "memory");
    }
    __attribute__((noinline)) void \(prefix)_outer(callback_t callback) {
        \(prefix)_inner(callback);
        __asm__ volatile("" ::: "memory");
    }
    """
}

/// A JIT-like stub in anonymous memory: `push rbp; mov rbp, rsp; movabs rax,
/// callee; call rax; pop rbp; ret`.
private func samplerEdgeCaseMakeStub(calling callee: UInt, protection: Int32) -> UnsafeMutableRawPointer? {
    guard
        let memory = mmap(nil, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
        memory != MAP_FAILED
    else { return nil }
    var code: [UInt8] = [0x55, 0x48, 0x89, 0xE5, 0x48, 0xB8]
    withUnsafeBytes(of: callee.littleEndian) { code += $0 }
    code += [0xFF, 0xD0, 0x5D, 0xC3]
    // Far into the page, so the return address is not near the page's start.
    let offset = 0x800
    code.withUnsafeBytes { memory.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
    guard mprotect(memory, 4096, protection) == 0 else { return nil }
    return memory.advanced(by: offset)
}

private func samplerEdgeCaseSymbol(_ handle: UnsafeMutableRawPointer, _ name: String) throws -> UInt {
    let address = UInt(bitPattern: dlsym(handle, name))
    try #require(address != 0, "no symbol \(name)")
    return address
}

private func samplerEdgeCaseNames(_ backtrace: StallBacktrace) -> [String] {
    backtrace.frames.map { $0.function ?? String(format: "0x%lx", $0.address) }
}

/// Recurses `depth` times, then sleeps until the gate opens.
@inline(never)
private func samplerEdgeCaseRecurse(_ depth: Int) -> Int {
    if depth == 0 {
        samplerEdgeCaseSleeper()
        return 0
    }
    return samplerEdgeCaseRecurse(depth - 1) &+ 1
}

/// Holds `count` copies of `decoy` (a real return address of other code) on its
/// stack while it sleeps.
@inline(never)
private func samplerEdgeCaseDecoyHolder(_ decoy: UInt, count: Int) {
    withUnsafeTemporaryAllocation(of: UInt.self, capacity: count) { buffer in
        for index in 0..<count { buffer[index] = decoy }
        samplerEdgeCaseSleeper()
        var sum: UInt = 0
        for value in buffer { sum &+= value }
        if sum == 42 { print(sum) }
    }
}

/// The thread id a short-lived thread hopes to get (thread-id reuse), and whether one got it.
private let samplerEdgeCaseWantedTid = Atomic<Int32>(0)
private let samplerEdgeCaseReuseHit = Atomic<Bool>(false)

/// A thread's body: returns at once unless it got the wanted id, in which case it
/// sleeps in `samplerEdgeCaseDecoyHolder` until the gate opens.
private func samplerEdgeCaseReuseBody(_: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    if stallcapture_current_tid() == samplerEdgeCaseWantedTid.load(ordering: .acquiring) {
        samplerEdgeCaseReuseHit.store(true, ordering: .releasing)
        samplerEdgeCaseReuseChecked.add(1, ordering: .releasing)
        samplerEdgeCaseDecoyHolder(0, count: 1)
    } else {
        samplerEdgeCaseReuseChecked.add(1, ordering: .releasing)
    }
    return nil
}

/// How many short-lived threads have compared their id (the creator waits for each
/// before it joins it: joining the one that got the id would wait for the gate).
private let samplerEdgeCaseReuseChecked = Atomic<Int>(0)

/// Starts a thread running `body` (which waits on the gate), samples it once with
/// `context`, lets it go and joins it.
func samplerEdgeCaseSample(with context: SamplingContext, _ body: @escaping @Sendable () -> Void) -> StallBacktrace {
    samplerEdgeCaseGate.store(0, ordering: .releasing)
    let thread = SamplerEdgeCaseThread(body)
    let backtrace = context.backtrace(of: thread.tid)
    samplerEdgeCaseGate.store(1, ordering: .releasing)
    #expect(thread.join())
    return backtrace
}

@Suite(
    "The sampler at its edges: descriptors, exiting threads, late libraries, odd stacks, phases", .serialized,
    .disabled(
        if: underThreadSanitizer,
        "ThreadSanitizer defers signals and sits between the program and libc: samples are not what they test"))
struct SamplerEdgeCaseTests {
    // MARK: - Kept-open /proc files

    @Test("80 sleeping threads sampled: at most 16 threads' files stay open, none after the context goes")
    func manyThreadsKeepBoundedDescriptors() throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let threads = (0..<80).map { _ in SamplerEdgeCaseThread { samplerEdgeCaseSleeper() } }
        let tids = Set(threads.map(\.tid))
        var context: SamplingContext? = SamplingContext()
        var maximum = 0
        for round in 0..<3 {
            for thread in threads {
                let backtrace = context!.backtrace(of: thread.tid)
                #expect(backtrace.unavailableReason == nil, "round \(round): \(backtrace)")
                // This context's own files: other suites' detectors, running
                // meanwhile, may hold files of these threads too (they look at
                // every thread when searching for a queue's job).
                maximum = max(maximum, context!.openTaskFileCount)
            }
        }
        #expect(
            maximum <= ProcTaskFiles.Kind.allCases.count * ProcTaskFiles.limit,
            "at most \(ProcTaskFiles.limit) threads' files: \(maximum) fds")
        context = nil
        // Other suites' detectors close theirs when their stalls end: waited for.
        var left = samplerEdgeCaseTaskDescriptors().filter { tids.contains($0.key) }
        for _ in 0..<100 where !left.isEmpty {
            usleep(50_000)
            left = samplerEdgeCaseTaskDescriptors().filter { tids.contains($0.key) }
        }
        #expect(left.isEmpty, "descriptors left after the context went: \(left)")
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        for thread in threads { #expect(thread.join()) }
    }

    @Test(
        "A thread that exits between samples: reported gone, its files closed by the next look")
    func exitedThreadBetweenSamples() throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let context = SamplingContext()
        let thread = SamplerEdgeCaseThread { samplerEdgeCaseSleeper() }
        // Asleep (read through both files, stat and syscall), not still starting
        // (a running thread is signalled: stat only).
        // The sleeper wakes every 2 ms; on a loaded machine it may wait for a core
        // (running, so signalled: stat only) at the moment of a sample. Sampled again
        // until one sample caught it asleep.
        var first = context.backtrace(of: thread.tid)
        for _ in 0..<200 where samplerEdgeCaseTaskDescriptors()[thread.tid] != 2 {
            usleep(5_000)
            first = context.backtrace(of: thread.tid)
        }
        #expect(first.unavailableReason == nil)
        #expect(samplerEdgeCaseTaskDescriptors()[thread.tid] == 2)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(thread.join())
        // Give the kernel time to reap the thread.
        var second = context.backtrace(of: thread.tid)
        for _ in 0..<100 where second.unavailableReason == nil {
            usleep(10_000)
            second = context.backtrace(of: thread.tid)
        }
        #expect(second.unavailableReason != nil, "an exited thread sampled: \(second)")
        // Looked at again, for a second: the dead thread's files must not stay open.
        for _ in 0..<10 {
            usleep(100_000)
            _ = context.backtrace(of: thread.tid)
        }
        #expect(
            samplerEdgeCaseTaskDescriptors()[thread.tid] == nil,
            "an exited thread's files stay open (\(second.unavailableReason ?? "")): \(samplerEdgeCaseTaskDescriptors()[thread.tid] ?? 0)"
        )
    }

    @Test("Threads that exit without being sampled again: how many descriptors the sampler holds for the dead")
    func exitedThreadsHoldDescriptors() throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let context = SamplingContext()
        let threads = (0..<20).map { _ in SamplerEdgeCaseThread { samplerEdgeCaseSleeper() } }
        let tids = Set(threads.map(\.tid))
        for thread in threads { _ = context.backtrace(of: thread.tid) }
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        for thread in threads { #expect(thread.join()) }
        usleep(100_000)
        let held = samplerEdgeCaseTaskDescriptors().filter { tids.contains($0.key) }.values.reduce(0, +)
        // Promise: bounded by the limit (a file of each kind per thread).
        #expect(held <= ProcTaskFiles.Kind.allCases.count * ProcTaskFiles.limit)
        withExtendedLifetime(context) {}
    }

    @Test("A stopped and released detector closes every /proc file it opened")
    func releasedDetectorClosesDescriptors() async throws {
        let queue = DispatchQueue(label: "samplerEdgeCase.blocked")
        let blockedTid = Locked<Int32>(0)
        var detector: StallDetector? = StallDetector(target: .queue(queue), threshold: .milliseconds(100))
        detector!.start()
        var iterator = detector!.events.makeAsyncIterator()
        try await Task.sleep(for: .milliseconds(100))
        queue.async {
            blockedTid.withLock { $0 = stallcapture_current_tid() }
            usleep(700_000)
        }
        var sawEnded = false
        while let event = await iterator.next() {
            if event.phase == .ended {
                sawEnded = true
                break
            }
        }
        #expect(sawEnded)
        let tid = blockedTid.withLock { $0 }
        let whileAlive = samplerEdgeCaseTaskDescriptors()[tid] ?? 0
        detector!.stop()
        detector = nil
        var left = samplerEdgeCaseTaskDescriptors()[tid] ?? 0
        for _ in 0..<200 where left > 0 {
            try await Task.sleep(for: .milliseconds(10))
            left = samplerEdgeCaseTaskDescriptors()[tid] ?? 0
        }
        // A stall's files are closed once it ends (the program
        // may need the descriptors): none need be open here any more.
        print("SAMPLER_ATTACK /proc files of the blocked thread after .ended: \(whileAlive)")
        #expect(left == 0, "a stopped and released detector kept \(left) /proc files of thread \(tid) open")
    }

    @Test("Between stalls a running detector holds no /proc file: two stalls, both cores busy meanwhile")
    func noDescriptorsBetweenStalls() throws {
        // On a thread of its own, judged by the files themselves: with both cores
        // busy and other suites beside, the cooperative pool (2 threads on 2
        // cores) can be held by synchronous tests for longer than this test
        // lasts, and an event stream read by a task saw nothing for 30 s (one CI
        // run).
        let failures = Locked<[String]>([])
        let done = DispatchSemaphore(value: 0)
        Thread {
            failures.withLock { $0 = Self.twoStallsLeaveNoFiles() }
            done.signal()
        }.start()
        done.wait()
        for failure in failures.withLock({ $0 }) { Issue.record(Comment(rawValue: failure)) }
    }

    /// Blocks a watched queue for 1.5 s (every 4 s, 30 s at most) until the
    /// detector has opened the blocked thread's /proc files and the block has
    /// ended, twice; after each, the files must be closed. Returns what failed.
    private static func twoStallsLeaveNoFiles() -> [String] {
        let stop = Locked(false)
        for _ in 0..<2 {
            Thread {
                var spins = 0
                while !stop.withLock({ $0 }) { spins &+= 1 }
                blackHoleForTests(spins)
            }.start()
        }
        defer { stop.withLock { $0 = true } }
        let queue = DispatchQueue(label: "samplerEdgeCase.between")
        let blockedTid = Locked<Int32>(0)
        let blocking = Locked(false)
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(100))
        detector.start()
        defer { detector.stop() }
        usleep(100_000)
        var failures: [String] = []
        for round in 0..<2 {
            let deadline = ContinuousClock.now + .seconds(30)
            var nextBlock = ContinuousClock.now
            var sampled = false
            while !(sampled && !blocking.withLock({ $0 })), ContinuousClock.now < deadline {
                if !blocking.withLock({ $0 }), ContinuousClock.now >= nextBlock {
                    blocking.withLock { $0 = true }
                    blockedTid.withLock { $0 = 0 }
                    queue.async {
                        blockedTid.withLock { $0 = stallcapture_current_tid() }
                        usleep(1_500_000)
                        blocking.withLock { $0 = false }
                    }
                    nextBlock = ContinuousClock.now + .seconds(4)
                }
                let tid = blockedTid.withLock { $0 }
                if tid != 0, blocking.withLock({ $0 }), (samplerEdgeCaseTaskDescriptors()[tid] ?? 0) > 0 {
                    sampled = true
                }
                usleep(10_000)
            }
            guard sampled else {
                failures.append("round \(round): the detector opened no /proc file of a blocked thread within 30 s")
                continue
            }
            let tid = blockedTid.withLock { $0 }
            // Closed on the detector's thread once the stall ended.
            var held = samplerEdgeCaseTaskDescriptors()[tid] ?? 0
            for _ in 0..<300 where held > 0 {
                usleep(10_000)
                held = samplerEdgeCaseTaskDescriptors()[tid] ?? 0
            }
            if held != 0 {
                failures.append("round \(round): \(held) /proc files of thread \(tid) still open between stalls")
            }
        }
        return failures
    }

    // MARK: - Code the image map does not know

    /// Samples a thread that runs `samplerEdgeCaseCaller` -> stub at `stub` -> callee, and returns the names.
    private func sampleThroughStub(
        _ stub: UnsafeMutableRawPointer, context: SamplingContext, spinning: Bool
    ) -> (StallBacktrace, stackMarker: UInt) {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let address = UInt(bitPattern: stub)
        let thread = SamplerEdgeCaseThread { samplerEdgeCaseCaller(address, callback: nil) }
        let backtrace = context.backtrace(of: thread.tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(thread.join())
        return (backtrace, thread.stackMarker)
    }

    @Test(
        "A frame in a JIT-like anonymous stub keeps its caller in the report (rwx and r-x, mapped before or after the first sample, asleep or spinning)",
        arguments: [
            (PROT_READ | PROT_EXEC, false, false), (PROT_READ | PROT_EXEC, true, false),
            (PROT_READ | PROT_WRITE | PROT_EXEC, false, false), (PROT_READ | PROT_WRITE | PROT_EXEC, true, false),
            (PROT_READ | PROT_EXEC, true, true), (PROT_READ | PROT_WRITE | PROT_EXEC, true, true),
        ])
    func jitStubKeepsCaller(protection: Int32, mappedAfterFirstSample: Bool, spinning: Bool) throws {
        let context = SamplingContext()
        let callee = unsafeBitCast(spinning ? samplerEdgeCaseSpinner : samplerEdgeCaseSleeper, to: UInt.self)
        var stub: UnsafeMutableRawPointer?
        if !mappedAfterFirstSample { stub = samplerEdgeCaseMakeStub(calling: callee, protection: protection) }
        // The first sample takes the image map and the text ranges.
        let warm = SamplerEdgeCaseThread { samplerEdgeCaseSleeper() }
        _ = context.backtrace(of: warm.tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(warm.join())
        if mappedAfterFirstSample { stub = samplerEdgeCaseMakeStub(calling: callee, protection: protection) }
        let made = try #require(stub)
        defer { munmap(UnsafeMutableRawPointer(bitPattern: UInt(bitPattern: made) & ~4095), 4096) }
        let (backtrace, marker) = sampleThroughStub(made, context: context, spinning: spinning)
        let names = samplerEdgeCaseNames(backtrace)
        #expect(backtrace.unavailableReason == nil)
        #expect(
            names.contains { $0.contains("samplerEdgeCaseCaller") },
            "the stub's caller is lost: \(names)")
        // No frame may be a pointer into the thread's own stack.
        let stackFrames = backtrace.frames.filter { $0.address &- (marker &- 0x10_0000) < 0x20_0000 }
        #expect(stackFrames.isEmpty, "stack addresses reported as frames: \(stackFrames)")
    }

    // MARK: - Libraries loaded after the first sample

    @Test(
        "A library loaded after the first sample: its frames are named (asleep and spinning)",
        .disabled("bug: text ranges are not taken again, so a dlopen after the first sample is never seen"),
        arguments: [false, true])
    func libraryLoadedLaterIsNamed(spinning: Bool) throws {
        let prefix = spinning ? "sampler_late_spin" : "sampler_late_sleep"
        let path = try #require(
            samplerEdgeCaseBuildLibrary(named: prefix, source: samplerEdgeCaseLibrarySource(prefix)))
        let context = SamplingContext()
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let warm = SamplerEdgeCaseThread { samplerEdgeCaseSleeper() }
        _ = context.backtrace(of: warm.tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(warm.join())

        let handle = try #require(dlopen(path, RTLD_NOW | RTLD_LOCAL))
        let outer = try samplerEdgeCaseSymbol(handle, "\(prefix)_outer")
        let callee = unsafeBitCast(spinning ? samplerEdgeCaseSpinner : samplerEdgeCaseSleeper, to: UInt.self)
        let backtrace = samplerEdgeCaseSample(with: context) { samplerEdgeCaseCaller(outer, callback: callee) }
        let names = samplerEdgeCaseNames(backtrace)
        #expect(names.contains("\(prefix)_outer"), "\(names)")
        #expect(names.contains("\(prefix)_inner"), "\(names)")
        #expect(names.contains { $0.contains("samplerEdgeCaseCaller") }, "\(names)")
    }

    @Test(
        "A library loaded after a first sample, on the stack of a newer context: the C library keeps its names",
        .disabled("bug: an image map taken again lists Runtime's debug files and names no library frame"))
    func imageMapTakenAgainKeepsNames() throws {
        // Any earlier context: the process' shared image map is taken.
        let before = samplerEdgeCaseSample(with: SamplingContext()) { samplerEdgeCaseSleeper() }
        #expect(samplerEdgeCaseNames(before).contains("usleep"), "before: \(samplerEdgeCaseNames(before))")

        let prefix = "sampler_refresh"
        let path = try #require(
            samplerEdgeCaseBuildLibrary(named: prefix, source: samplerEdgeCaseLibrarySource(prefix)))
        let handle = try #require(dlopen(path, RTLD_NOW | RTLD_LOCAL))
        let outer = try samplerEdgeCaseSymbol(handle, "\(prefix)_outer")
        // A context made now lists the library as text; the shared map does not know it.
        let context = SamplingContext()
        let callee = unsafeBitCast(samplerEdgeCaseSleeper, to: UInt.self)
        let backtrace = samplerEdgeCaseSample(with: context) { samplerEdgeCaseCaller(outer, callback: callee) }
        let names = samplerEdgeCaseNames(backtrace)
        #expect(names.contains("\(prefix)_outer"), "\(names)")
        #expect(names.contains("usleep"), "the C library's frames lost their names: \(names)")
        #expect(names.contains("start_thread"), "the C library's frames lost their names: \(names)")

        // And a detector made afterwards (it starts from the shared map).
        let after = samplerEdgeCaseSample(with: SamplingContext()) { samplerEdgeCaseSleeper() }
        #expect(samplerEdgeCaseNames(after).contains("usleep"), "a later context: \(samplerEdgeCaseNames(after))")
    }

    @Test(
        "dlclose a library, dlopen another at the same address: the new one's names, not the old one's",
        .disabled("bug: names (and decoded code) cached by address survive a dlclose; no refresh for a known range"))
    func libraryReplacedAtSameAddress() throws {
        let alphaPath = try #require(
            samplerEdgeCaseBuildLibrary(named: "sampler_alpha", source: samplerEdgeCaseLibrarySource("sampler_alpha")))
        let betaPath = try #require(
            samplerEdgeCaseBuildLibrary(named: "sampler_betaa", source: samplerEdgeCaseLibrarySource("sampler_betaa")))
        // Loaded before the context's first sample, so its image is known.
        let alpha = try #require(dlopen(alphaPath, RTLD_NOW | RTLD_LOCAL))
        let alphaOuter = try samplerEdgeCaseSymbol(alpha, "sampler_alpha_outer")
        let context = SamplingContext()
        let callee = unsafeBitCast(samplerEdgeCaseSleeper, to: UInt.self)

        let first = samplerEdgeCaseSample(with: context) { samplerEdgeCaseCaller(alphaOuter, callback: callee) }
        #expect(samplerEdgeCaseNames(first).contains("sampler_alpha_outer"), "\(samplerEdgeCaseNames(first))")
        #expect(samplerEdgeCaseNames(first).contains("usleep"), "first: \(samplerEdgeCaseNames(first))")

        dlclose(alpha)
        let beta = try #require(dlopen(betaPath, RTLD_NOW | RTLD_LOCAL))
        defer { dlclose(beta) }
        let betaOuter = try samplerEdgeCaseSymbol(beta, "sampler_betaa_outer")
        // Same layout, same place: the same return addresses as before.
        try #require(betaOuter == alphaOuter, "the loader put the second library elsewhere; nothing to test")

        let second = samplerEdgeCaseSample(with: context) { samplerEdgeCaseCaller(betaOuter, callback: callee) }
        let names = samplerEdgeCaseNames(second)
        #expect(names.contains("sampler_betaa_outer"), "stale names after dlclose+dlopen: \(names)")
        #expect(names.contains("usleep"), "libc unnamed after the image map was taken again: \(names)")
        #expect(!names.contains { $0.hasPrefix("sampler_alpha") }, "an unloaded library's names: \(names)")
    }

    // MARK: - Stack shapes

    @Test(
        "Very deep recursion asleep in the kernel: every recursion frame in order up to the copy, marked truncated or reaching the root"
    )
    func deepRecursion() throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let thread = SamplerEdgeCaseThread(stackSize: 64 << 20) { _ = samplerEdgeCaseRecurse(20_000) }
        let context = SamplingContext()
        let backtrace = context.backtrace(of: thread.tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(thread.join())
        let names = samplerEdgeCaseNames(backtrace)
        let recursion = names.filter { $0.contains("samplerEdgeCaseRecurse") }.count
        #expect(recursion >= 1_000, "only \(recursion) recursion frames of 20,000")
        // Innermost first: the sleeper before every recursion frame.
        let sleeper = names.firstIndex { $0.contains("samplerEdgeCaseSleeper") }
        let firstRecursion = names.firstIndex { $0.contains("samplerEdgeCaseRecurse") }
        #expect(sleeper != nil && firstRecursion != nil && sleeper! < firstRecursion!, "\(names.prefix(12))")
        #expect(
            backtrace.isTruncated || names.contains("start_thread"),
            "neither truncated nor complete: \(names.suffix(6))")
    }

    @Test("A thread with the smallest stack, asleep and spinning: sampled whole", arguments: [false, true])
    func tinyStack(spinning: Bool) throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let body: @Sendable () -> Void = { spinning ? samplerEdgeCaseSpinner() : samplerEdgeCaseSleeper() }
        let thread = SamplerEdgeCaseThread(stackSize: 16 << 10, body)
        let context = SamplingContext()
        var results: [StallBacktrace] = []
        for _ in 0..<20 { results.append(context.backtrace(of: thread.tid)) }
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(thread.join())
        for backtrace in results {
            let names = samplerEdgeCaseNames(backtrace)
            #expect(backtrace.unavailableReason == nil, "\(backtrace)")
            #expect(
                names.contains { $0.contains(spinning ? "samplerEdgeCaseSpinner" : "samplerEdgeCaseSleeper") },
                "\(names)")
            #expect(names.contains("start_thread"), "\(names)")
        }
    }

    @Test("Hundreds of real return addresses of other code on the stack: none becomes a certain frame")
    func decoyReturnAddresses() throws {
        // A real return address: where samplerEdgeCaseCaller's call returns.
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let callee = unsafeBitCast(samplerEdgeCaseSleeper, to: UInt.self)
        let source = SamplerEdgeCaseThread { samplerEdgeCaseCaller(callee, callback: nil) }
        let context = SamplingContext()
        let reference = context.backtrace(of: source.tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(source.join())
        let decoys = reference.frames.filter { $0.function?.contains("samplerEdgeCaseCaller") == true }.map(\.address)
        let decoy = try #require(decoys.first, "\(samplerEdgeCaseNames(reference))")
        // Also the return address inside the sleeper's own caller chain (usleep's caller).
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let holder = SamplerEdgeCaseThread { samplerEdgeCaseDecoyHolder(decoy, count: 600) }
        var samples: [StallBacktrace] = []
        for _ in 0..<5 { samples.append(context.backtrace(of: holder.tid)) }
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(holder.join())
        for backtrace in samples {
            let certain = backtrace.frames.filter { !$0.isUncertain }
            #expect(
                !certain.contains { $0.function?.contains("samplerEdgeCaseCaller") == true },
                "a decoy became a certain frame: \(samplerEdgeCaseNames(backtrace))")
            #expect(samplerEdgeCaseNames(backtrace).contains { $0.contains("samplerEdgeCaseDecoyHolder") })
            #expect(samplerEdgeCaseNames(backtrace).contains("start_thread"), "\(samplerEdgeCaseNames(backtrace))")
        }
    }

    // MARK: - Whole stalls in a child process (stall-probe sampler-…)

    /// The `.ended` profile of stall `id`: samples per function.
    private func endedProfile(_ run: ProbeRun, id: Int) -> (samples: Int, functions: [String: Int]) {
        var samples = 0
        var functions: [String: Int] = [:]
        for line in run.lines {
            let fields = line.split(separator: " ", maxSplits: 4)
            if fields.count >= 4, fields[0] == "PROFILE", fields[1] == "\(id)", fields[2] == "ended" {
                samples = Int(fields[3]) ?? 0
            } else if fields.count == 5, fields[0] == "FUNCTION", fields[1] == "\(id)", fields[2] == "ended" {
                functions[String(fields[4]), default: 0] = max(functions[String(fields[4])] ?? 0, Int(fields[3]) ?? 0)
            }
        }
        return (samples, functions)
    }

    private func samples(of name: String, in functions: [String: Int]) -> Int {
        functions.filter { $0.key.hasPrefix(name) }.values.max() ?? 0
    }

    @Test("Four phases of one stall (asleep, spinning, in read(2), in a futex): each gets its share")
    func fourPhasesEachGetSamples() throws {
        let run = try ProbeRun.run(["sampler-phases", "500"])
        #expect(run.exitStatus == 0)
        let (total, functions) = endedProfile(run, id: 2)
        let phases = [
            "samplerEdgeCaseSleepPhase", "samplerEdgeCaseSpinPhase", "samplerEdgeCaseReadPhase",
            "samplerEdgeCaseFutexPhase",
        ]
        let counts = phases.map { samples(of: $0, in: functions) }
        #expect(total >= 8, "\(total) samples: \(run.lines.filter { $0.hasPrefix("PROFILE") })")
        for (phase, count) in zip(phases, counts) {
            // A quarter each; generous: between 8 % and 45 %.
            #expect(
                count * 100 >= total * 8 && count * 100 <= total * 45,
                "\(phase): \(count) of \(total) samples (all: \(zip(phases, counts).map { "\($0) \($1)" }))")
        }
    }

    @Test(
        "A phase spent with SIGPROF blocked is not silently dropped from the profile")
    func maskedPhaseIsNotLost() throws {
        let run = try ProbeRun.run(["sampler-masked", "600"])
        #expect(run.exitStatus == 0)
        let (total, functions) = endedProfile(run, id: 2)
        let sleeping = samples(of: "samplerEdgeCaseSleepPhase", in: functions)
        // Half the stall was spent in samplerEdgeCaseMaskedSpinPhase: at most about
        // half of the profile may say samplerEdgeCaseSleepPhase.
        #expect(total > 0)
        #expect(sleeping * 100 <= total * 70, "asleep in \(sleeping) of \(total) samples: the masked half is lost")
    }

    @Test(
        "With one descriptor left, a stall neither takes it for good nor says the thread kept changing state")
    func lastDescriptor() throws {
        let run = try ProbeRun.run(["sampler-nofile", "1"])
        #expect(run.exitStatus == 0)
        #expect(
            run.lines.contains("OPENED 1 0"), "\(run.lines.filter { $0.hasPrefix("OPENED") || $0.hasPrefix("FD") })")
        for event in run.events {
            #expect(!event.report.contains("kept changing state"), "\(event.report.prefix(300))")
        }
    }

    @Test("With few descriptors left, stalls are still named, and the detector keeps at most 2 per sampled thread")
    func fewDescriptors() throws {
        let run = try ProbeRun.run(["sampler-nofile", "8"])
        #expect(run.exitStatus == 0)
        let opened = run.lines.first { $0.hasPrefix("OPENED ") }?.split(separator: " ").dropFirst().first
            .flatMap { Int($0) }
        #expect((opened ?? 0) >= 6, "\(run.lines.filter { $0.hasPrefix("OPENED") || $0.hasPrefix("FD") })")
        #expect(run.events.count == 4)
        for event in run.events {
            // The C library is still named (its symbols are read from files).
            #expect(event.report.contains("clock_nanosleep"), "\(event.report.prefix(400))")
        }
    }

    // A release stall-probe built from commit fb5ca8d's SamplerEdgeCaseScenarios.swift lost these frames in
    // every event of `sampler-nofile` (clock_nanosleep, then _dispatch_continuation_pop): see CHANGELOG.
    @Test("A sleeping function reached by the job's closure through a tail call keeps its frames (release build)")
    func tailCalledSleeperKeepsFrames() throws {
        let run = try ProbeRun.run(["sampler-tailcall", "500"])
        #expect(run.exitStatus == 0)
        #expect(run.events.count == 4)
        for event in run.events {
            for name in ["clock_nanosleep@", " nanosleep ", " usleep ", " samplerEdgeCaseSleepPhase("] {
                #expect(event.report.contains(name), "\(name): \(event.report)")
            }
        }
    }

    @Test("A job that sleeps 1 ms at a time between 1 ms of work: looks rarely cut a sleep short")
    func sleepsCutShort() throws {
        // A look that finds the thread running signals it; one that finds it
        // asleep reads it from /proc. Only a thread that falls asleep between the
        // look and the signal has its sleep ended early (EINTR): measured 4–8 of
        // about 1,400 sleeps, 294 samples (release, quiet); 1–8 of 147 (debug, beside
        // two busy processes). Signalled whatever
        // its state, about half of the looks would cut one short.
        // The job must get a core for most of its 3 s (at least 500 of its
        // about 1,500 sleeps) for the count to mean anything: a machine that gave
        // it less missed that time bound, and the scenario runs again (at most
        // 3 times). Every run's cut sleeps are bounded all the same.
        var run = ProbeRun()
        var (total, sleeps, cut) = (0, 0.0, Double.infinity)
        for _ in 0..<3 where sleeps < 500 {
            run = try ProbeRun.run(["sampler-sleep-cut", "3000"])
            #expect(run.exitStatus == 0)
            total = endedProfile(run, id: 1).0
            let counts = run.value("SLEEPS")
            (sleeps, cut) = (counts.first ?? 0, counts.dropFirst().first ?? .infinity)
            print("sampler-sleep-cut: \(cut) of \(sleeps) sleeps cut short, \(total) samples")
            #expect(cut * 5 <= Double(total), "\(cut) sleeps cut short by \(total) samples")
        }
        #expect(
            total >= 30 && sleeps >= 500, "\(run.lines.filter { $0.hasPrefix("PROFILE") || $0.hasPrefix("SLEEPS") })")
    }

    // MARK: - Cost outside the detector's thread

    @Test("What a signal sample costs the sampled thread (not charged to the pace's CPU clock)")
    func signalSampleCostOnSampledThread() throws {
        // The spinning thread measures its own CPU per fixed slice of work; the
        // handler's time (glibc's unwind and a 256 KB copy) shows as extra CPU.
        let result = Locked<(plain: Double, sampled: Double)>((0, 0))
        let phase = Atomic<Int>(0)
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let thread = SamplerEdgeCaseThread {
            func slices(_ count: Int) -> Double {
                let before = StallProfiler.threadCPU()
                var spins = 0
                for _ in 0..<count * 1_000_000 { spins &+= 1 }
                _ = spins
                return Double(StallProfiler.threadCPU() - before)
            }
            // Until the test has warmed its context (names cached).
            while phase.load(ordering: .acquiring) == 0 { _ = slices(1) }
            let plain = slices(100)
            phase.store(2, ordering: .releasing)
            let sampled = slices(100)
            phase.store(3, ordering: .releasing)
            result.withLock { $0 = (plain, sampled) }
        }
        let context = SamplingContext()
        for _ in 0..<3 { _ = context.backtrace(of: thread.tid) }
        phase.store(1, ordering: .releasing)
        while phase.load(ordering: .acquiring) == 1 { usleep(1_000) }
        var count = 0
        var detectorCPU: Int64 = 0
        while phase.load(ordering: .acquiring) == 2 {
            let before = StallProfiler.threadCPU()
            _ = context.backtrace(of: thread.tid)
            detectorCPU += StallProfiler.threadCPU() - before
            count += 1
        }
        #expect(thread.join())
        let (plain, sampled) = result.withLock { $0 }
        let perSample = (sampled - plain) / Double(max(1, count))
        print(
            "SAMPLER_ATTACK signal samples \(count): sampled thread +\(Int(perSample)) ns each, detector \(Int(detectorCPU) / max(1, count)) ns each"
        )
        #expect(count > 0)
    }

    // MARK: - Code unmapped or protected while it is decoded

    @Test(
        "Unwinding while another thread flips a code page between r-x and PROT_NONE (or unmaps it) never faults",
        arguments: [false, true])
    func codePageFlippedDuringUnwind(unmapping: Bool) throws {
        let callee = unsafeBitCast(samplerEdgeCaseSleeper, to: UInt.self)
        let stub = try #require(samplerEdgeCaseMakeStub(calling: callee, protection: PROT_READ | PROT_EXEC))
        let page = UInt(bitPattern: stub) & ~4095
        let returnAddress = UInt(bitPattern: stub) + 16  // after `call rax`
        let running = Atomic<Bool>(true)
        let flips = Atomic<Int>(0)
        let flipper = SamplerEdgeCaseThread {
            let pointer = UnsafeMutableRawPointer(bitPattern: page)!
            while running.load(ordering: .relaxed) {
                if unmapping {
                    munmap(pointer, 4096)
                    _ = mmap(pointer, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                } else {
                    mprotect(pointer, 4096, PROT_NONE)
                    mprotect(pointer, 4096, PROT_READ | PROT_EXEC)
                }
                flips.add(1, ordering: .relaxed)
            }
        }
        // A stack whose every word is a return address into the page (and
        // addresses at the page's very start, whose call bytes are on the page before).
        var words: [UInt] = []
        for index in 0..<64 { words.append(index % 2 == 0 ? returnAddress : page + UInt(index % 8)) }
        let deadline = ContinuousClock.now + .seconds(2)
        var unwinds = 0
        while ContinuousClock.now < deadline {
            let blocks = MemoryBlocks()
            let unwinder = StackUnwinder(
                copy: StackCopy(pc: returnAddress, sp: 0x1000, fp: nil, words: words, truncated: false),
                isText: { $0 >= page && $0 < page + 4096 }, readWord: { blocks.word(at: $0) })
            _ = unwinder.unwind()
            unwinds += 1
        }
        running.store(false, ordering: .relaxed)
        #expect(flipper.join())
        munmap(UnsafeMutableRawPointer(bitPattern: page), 4096)
        print("SAMPLER_ATTACK \(unwinds) unwinds while the page flipped \(flips.load(ordering: .relaxed)) times")
        #expect(unwinds > 100)
    }

    // MARK: - A thread id used again

    @Test("A thread id reused by a new thread between samples: the new thread's stack, not the old one's")
    func threadIDReused() throws {
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let context = SamplingContext()
        let old = SamplerEdgeCaseThread { _ = samplerEdgeCaseRecurse(3) }
        let first = context.backtrace(of: old.tid)
        #expect(
            samplerEdgeCaseNames(first).contains { $0.contains("samplerEdgeCaseRecurse") },
            "\(samplerEdgeCaseNames(first))")
        let tid = old.tid
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(old.join())
        usleep(20_000)
        // Short-lived threads until one gets the same id (pid_max wraps around).
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        samplerEdgeCaseWantedTid.store(tid, ordering: .releasing)
        samplerEdgeCaseReuseHit.store(false, ordering: .releasing)
        samplerEdgeCaseReuseChecked.store(0, ordering: .releasing)
        var holder: pthread_t?
        for created in 1...200_000 {
            var thread = pthread_t()
            guard pthread_create(&thread, nil, samplerEdgeCaseReuseBody, nil) == 0 else { break }
            while samplerEdgeCaseReuseChecked.load(ordering: .acquiring) < created { sched_yield() }
            if samplerEdgeCaseReuseHit.load(ordering: .acquiring) {
                holder = thread
                break
            }
            pthread_join(thread, nil)
        }
        guard let holder else {
            print("SAMPLER_ATTACK no thread got id \(tid) again; nothing to test")
            return
        }
        usleep(50_000)
        let second = context.backtrace(of: tid)
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        pthread_join(holder, nil)
        let names = samplerEdgeCaseNames(second)
        #expect(second.unavailableReason == nil, "\(second)")
        #expect(names.contains { $0.contains("samplerEdgeCaseDecoyHolder") }, "the new thread's stack: \(names)")
        #expect(!names.contains { $0.contains("samplerEdgeCaseRecurse") }, "the old thread's frames: \(names)")
    }

    @Test(
        "A warm detector's .started comes on time for a thread that blocks SIGPROF")
    func maskedThreadStartedOnTime() throws {
        let run = try ProbeRun.run(["sampler-masked-only", "1000"])
        #expect(run.exitStatus == 0)
        let started = run.started.filter { $0.id == 2 }
        #expect(started.count == 1)
        // Threshold 250 ms, heartbeat 25 ms: 340 ms on a quiet machine. On a busy
        // one the warm-up stall (no signal blocked) in the same run says how late
        // a look is anyway: the masked stall may be as late as that, plus 90 ms.
        let reference = run.started.first { $0.id == 1 }?.milliseconds ?? 250
        let bound = max(340, reference + 90)
        for event in started {
            #expect(
                event.milliseconds <= bound,
                "stall 2 .started after \(event.milliseconds) ms (the warm-up stall's after \(reference) ms)")
        }
    }

    @Test(
        "Sampling a thread asleep under a JIT stub while another thread flips the stub's page to PROT_NONE never faults"
    )
    func jitPageFlippedWhileSampled() throws {
        let callee = unsafeBitCast(samplerEdgeCaseSleeper, to: UInt.self)
        let stub = try #require(samplerEdgeCaseMakeStub(calling: callee, protection: PROT_READ | PROT_EXEC))
        let page = UInt(bitPattern: stub) & ~4095
        samplerEdgeCaseGate.store(0, ordering: .releasing)
        let address = UInt(bitPattern: stub)
        let sleeper = SamplerEdgeCaseThread { samplerEdgeCaseCaller(address, callback: nil) }
        let running = Atomic<Bool>(true)
        let flipper = SamplerEdgeCaseThread {
            let pointer = UnsafeMutableRawPointer(bitPattern: page)!
            while running.load(ordering: .relaxed) {
                // Never PROT_NONE for long: the sleeper returns through the page.
                mprotect(pointer, 4096, PROT_NONE)
                mprotect(pointer, 4096, PROT_READ | PROT_EXEC)
            }
        }
        let deadline = ContinuousClock.now + .seconds(3)
        var samples = 0
        while ContinuousClock.now < deadline {
            // A new context each time: nothing decoded is remembered.
            _ = SamplingContext().backtrace(of: sleeper.tid)
            samples += 1
        }
        running.store(false, ordering: .relaxed)
        #expect(flipper.join())
        samplerEdgeCaseGate.store(1, ordering: .releasing)
        #expect(sleeper.join())
        print("SAMPLER_ATTACK \(samples) samples while the stub's page flipped")
    }

    @Test(
        "A frame in execute-only code (PROT_EXEC alone: no read with protection keys) while sampled, asleep and spinning",
        arguments: [false, true])
    func executeOnlyStub(spinning: Bool) throws {
        let context = SamplingContext()
        let callee = unsafeBitCast(spinning ? samplerEdgeCaseSpinner : samplerEdgeCaseSleeper, to: UInt.self)
        let stub = try #require(samplerEdgeCaseMakeStub(calling: callee, protection: PROT_EXEC))
        defer { munmap(UnsafeMutableRawPointer(bitPattern: UInt(bitPattern: stub) & ~4095), 4096) }
        let (backtrace, _) = sampleThroughStub(stub, context: context, spinning: spinning)
        let names = samplerEdgeCaseNames(backtrace)
        #expect(backtrace.unavailableReason == nil)
        #expect(names.contains { $0.contains("samplerEdgeCaseCaller") }, "the stub's caller is lost: \(names)")
    }

    @Test(
        "The cooperative pool, or a custom executor, blocked in a process with 60 older threads: the blockers are found",
        arguments: [
            ("sampler-pool-crowd", "uniquelyNamedPoolBlocker"), ("sampler-custom-crowd", "uniquelyNamedQueueBlocker"),
        ])
    func blockerFoundAmongManyThreads(scenario: String, blocker: String) throws {
        let run = try ProbeRun.run([scenario, "60"])
        #expect(run.exitStatus == 0)
        #expect(run.events.count == 2)
        for event in run.events {
            #expect(event.report.contains(blocker), "\(event.report.prefix(300))")
        }
    }
}

#endif
