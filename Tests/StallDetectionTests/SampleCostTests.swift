import CStallCapture
import Foundation
import Testing

@testable import StallDetection

/// What one profile sample costs: reads through the kernel in blocks, tail jumps
/// decoded once, one-time naming charged as naming, stacks that are not text.
@Suite("Sample cost (in process)")
struct SampleCostTests {
    /// Two pages: the first readable, filled with a pattern; the second not.
    final class TwoPages {
        let base: UnsafeMutableRawPointer
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))

        init() throws {
            let mapped = mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            guard let mapped, mapped != MAP_FAILED else { throw CocoaError(.fileReadUnknown) }
            base = mapped
            for index in 0..<page {
                base.storeBytes(of: UInt8(truncatingIfNeeded: index &* 7 &+ 3), toByteOffset: index, as: UInt8.self)
            }
            mprotect(base + page, page, PROT_NONE)
        }

        deinit { munmap(base, 2 * page) }

        var address: UInt { UInt(bitPattern: base) }

        func expected(at offset: Int) -> UInt { base.loadUnaligned(fromByteOffset: offset, as: UInt.self) }
    }

    @Test("words at every alignment read as memory holds them; any byte on an unreadable page makes nil")
    func wordsAtEveryAlignment() throws {
        let pages = try TwoPages()
        let blocks = MemoryBlocks()
        for offset in stride(from: 0, through: pages.page - 8, by: 1) where offset % 61 == 0 || offset > pages.page - 40
        {
            #expect(blocks.word(at: pages.address + UInt(offset)) == pages.expected(at: offset), "offset \(offset)")
        }
        for offset in (pages.page - 7)..<(pages.page + 16) {
            #expect(
                blocks.word(at: pages.address + UInt(offset)) == nil, "offset \(offset) reaches the unreadable page")
        }
        #expect(blocks.word(at: UInt.max - 3) == nil)
        #expect(blocks.word(at: 0) == nil)
    }

    @Test("32 words from an aligned block are one system call; a function start anywhere, at most two")
    func oneReadPerBlock() throws {
        let pages = try TwoPages()
        let aligned = MemoryBlocks()
        for index in 0..<32 { _ = aligned.word(at: pages.address + 512 + UInt(index * 8)) }
        #expect(aligned.reads == 1)
        let unaligned = MemoryBlocks()
        for index in 0..<32 { _ = unaligned.word(at: pages.address + 1_000 + 3 + UInt(index * 8)) }
        #expect(unaligned.reads <= 2)
        // Decoding a real function's tail jumps reads its first 256 bytes.
        let start = UInt(bitPattern: unsafeBitCast(getpid as @convention(c) () -> pid_t, to: Int.self))
        let code = MemoryBlocks()
        _ = CallSite.tailJumps(from: start, readWord: code.word(at:))
        #expect(code.reads <= 4, "\(code.reads) reads")
    }

    @Test("a pointer into a thread's stack is not text, though the toolchain makes stacks executable")
    func stacksAreNotText() throws {
        let symbolicator = Symbolicator()
        var local = 0
        let stackAddress = withUnsafeMutablePointer(to: &local) { UInt(bitPattern: $0) }
        #expect(!symbolicator.isTextAddress(stackAddress))
        let code = UInt(bitPattern: unsafeBitCast(getpid as @convention(c) () -> pid_t, to: Int.self))
        #expect(symbolicator.isTextAddress(code + 16))
        // The reason the check is needed: is this thread's stack mapped executable?
        let maps = try String(contentsOfFile: "/proc/self/maps", encoding: .utf8)
        let stackIsExecutable = maps.split(separator: "\n").contains { line in
            let fields = line.split(separator: " ")
            let bounds = fields[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
            return bounds.count == 2 && bounds[0] <= stackAddress && stackAddress < bounds[1]
                && fields[1].hasPrefix("rwx")
        }
        print("this thread's stack is mapped \(stackIsExecutable ? "rwx" : "without x")")
    }

    @Test("naming a function's start for the first time counts as naming (the pace forgives it), once")
    func functionStartIsNaming() throws {
        let symbolicator = Symbolicator()
        let start = UInt(bitPattern: unsafeBitCast(getpid as @convention(c) () -> pid_t, to: Int.self))
        let before = symbolicator.namingCost
        let found = symbolicator.functionStart(of: start + 4, isReturnAddress: false)
        let first = symbolicator.namingCost
        #expect(first > before, "the first lookup names the address")
        #expect(found == start)
        _ = symbolicator.functionStart(of: start + 4, isReturnAddress: false)
        #expect(symbolicator.namingCost == first, "the second is cached")
    }

    @Test("the code cache is bounded: each table is emptied when full")
    func codeCacheBound() {
        let cache = StackUnwinder.CodeCache()
        for index in 0..<StackUnwinder.CodeCache.limit {
            cache.remember(CallSite.TailJumps(targets: [UInt(index)], indirect: false), from: UInt(index))
            cache.remember(.known(UInt(index)), before: UInt(index))
        }
        #expect(cache.jumps.count == StackUnwinder.CodeCache.limit)
        #expect(cache.calls.count == StackUnwinder.CodeCache.limit)
        cache.remember(CallSite.TailJumps(), from: UInt.max)
        cache.remember(.unknown, before: UInt.max)
        #expect(cache.jumps.count == 1 && cache.calls.count == 1)
        #expect(cache.jumps(from: UInt.max) == CallSite.TailJumps())
        if case .unknown = cache.call(before: UInt.max) {
        } else {
            Issue.record("\(String(describing: cache.call(before: UInt.max)))")
        }
        cache.removeAll()
        #expect(cache.jumps.isEmpty && cache.calls.isEmpty)
    }
}

/// Recurses `depth` times (each frame holding 64 bytes of locals), then sleeps
/// `nap` microseconds at a time until `done`.
@inline(never)
func sampleCostRecurse(_ depth: Int, _ done: Locked<Bool>, nap: UInt32 = 20_000) -> Int {
    var locals = (depth, depth &* 3, depth &* 5, depth &* 7, depth &* 11, depth &* 13, depth &* 17, depth &* 19)
    if depth == 0 {
        while !done.withLock({ $0 }) { usleep(nap) }
        return 0
    }
    let below = sampleCostRecurse(depth - 1, done, nap: nap)
    return withUnsafeBytes(of: &locals) { $0.load(as: Int.self) } &+ below
}

nonisolated(unsafe) var sampleCostSortDone: Locked<Bool>?

/// Sorts two values with a C callback that recurses 600 times and naps (50 µs
/// at a time, so a sample finds it asleep or running, or waking between the
/// first copy of its stack and the whole one): the
/// recursion sits above libc's `qsort`, which keeps no frame record, so its
/// caller is found only by scanning the copy, beyond the first 32 KB.
@inline(never)
func sampleCostSortOuter() -> Int32 {
    var values: [Int32] = [2, 1]
    values.withUnsafeMutableBufferPointer { buffer in
        qsort(buffer.baseAddress!, buffer.count, MemoryLayout<Int32>.size, sampleCostCompare)
    }
    return values[0]
}

let sampleCostCompare: @convention(c) (UnsafeRawPointer?, UnsafeRawPointer?) -> Int32 = { left, right in
    if let done = sampleCostSortDone { blackHoleForTests(sampleCostRecurse(600, done, nap: 50)) }
    return left!.load(as: Int32.self) < right!.load(as: Int32.self) ? -1 : 1
}

@Suite(
    "Sampling a deep sleeping stack (in process)",
    .disabled(
        if: underThreadSanitizer,
        "ThreadSanitizer's interceptors (without frame pointers) sit between the program and libc"))
struct DeepKernelSampleTests {
    @Test("a stack deeper than the first copy (32 KB) is sampled whole: every recursion frame, down to the root")
    func deepStack() throws {
        let done = Locked(false)
        let depth = 600
        defer { done.withLock { $0 = true } }
        let target = startSleepingThread { blackHoleForTests(sampleCostRecurse(depth, done)) }
        let context = SamplingContext()
        for _ in 0..<3 {
            let backtrace = context.backtrace(of: target)
            let names = backtrace.frames.map { $0.function ?? "?" }
            let recursion = backtrace.frames.filter { $0.function?.hasPrefix("sampleCostRecurse") == true }
            #expect(recursion.count == depth + 1, "\(recursion.count) recursion frames of \(depth + 1)")
            #expect(!backtrace.isTruncated, "\(names.suffix(8))")
            #expect(names.contains("start_thread"), "\(names.suffix(8))")
            usleep(20_000)
        }
    }
}

extension DeepKernelSampleTests {
    @Test("a deep stack above a frameless qsort, asleep or awake: every sample finds the sort's caller")
    func deepStackAboveQsort() throws {
        let done = Locked(false)
        sampleCostSortDone = done
        defer { done.withLock { $0 = true } }
        let target = startSleepingThread { blackHoleForTests(Int(sampleCostSortOuter())) }
        // Every sample judged: one that finds the sleeper awake signals it, and
        // one whose first copy it woke after is taken again by a signal.
        let context = SamplingContext()
        var wrong: [String] = []
        for _ in 0..<40 {
            let backtrace = context.backtrace(of: target)
            let names = backtrace.frames.map { $0.function ?? "?" }
            let recursion = names.filter { $0.hasPrefix("sampleCostRecurse") }.count
            let sort = names.firstIndex { $0.hasPrefix("qsort") }
            let whole =
                recursion == 601 && sort.map { names[$0...].contains { $0.hasPrefix("sampleCostSortOuter") } } == true
                && names.contains("start_thread") && !backtrace.isTruncated
            if !whole {
                let marked = backtrace.frames.map { ($0.function ?? "?") + ($0.isUncertain ? " ?" : "") }
                let shown = "\(marked.prefix(8)) … \(marked.suffix(10))"
                wrong.append("\(recursion) recursion frames, truncated \(backtrace.isTruncated): \(shown)")
            }
            usleep(1_000)
        }
        // A sleeper that wakes and sleeps again at the same place while its stack
        // is copied leaves a copy that mixes what it ran meanwhile with the
        // sleeping frames: read as asleep, it showed the runtime's stale frames in
        // place of the 601 recursion frames, marked certain (about 1 sample in
        // 300). Its scheduling counts tell it ran; it is then signalled.
        #expect(wrong.isEmpty, "\(wrong.count) of 40 samples wrong: \(wrong)")
    }
}

/// `/proc` files kept open per thread and read again from offset 0.
@Suite("Thread files kept open (in process)")
struct ProcTaskFilesTests {
    @Test(
        "one open per file: a thread's state read again follows it (asleep, then running), and a gone thread reads nil")
    func followsTheThread() throws {
        let phase = Locked(0)  // 0 sleep, 1 spin, 2 exit
        let tid = Locked<Int32>(0)
        let thread = Thread {
            tid.withLock { $0 = stallcapture_current_tid() }
            while phase.withLock({ $0 }) == 0 { usleep(2_000) }
            var spins = 0
            while phase.withLock({ $0 }) == 1 { spins &+= 1 }
        }
        thread.start()
        var target: Int32 = 0
        while target == 0 {
            usleep(1_000)
            target = tid.withLock { $0 }
        }
        let files = ProcTaskFiles()
        try expectReadAsleep(files, thread: target)
        phase.withLock { $0 = 1 }
        var letters: [Character?] = []
        // Running, read through the same files: the syscall file says so too,
        // unless the thread entered a system call between the two reads (the
        // ThreadSanitizer runtime makes some while the thread spins): read both
        // again until they agree.
        var running = false
        for _ in 0..<2_000 where !running {
            letters.append(files.stateLetter(thread: target))
            running =
                letters.last == "R" && (files.read(.syscall, thread: target).map { $0.hasPrefix("running") } ?? false)
            if !running { usleep(500) }
        }
        #expect(letters.last == "R", "\(letters.suffix(5))")
        #expect(running, "the syscall file never said running while the stat file said R")
        #expect(files.opens == 2, "stat and syscall opened once each: \(files.opens)")
        phase.withLock { $0 = 2 }
        // The thread exits: its kept files fail, and by path it is gone.
        var gone = false
        for _ in 0..<2_000 where !gone {
            let letter = files.stateLetter(thread: target)
            gone = letter == nil || letter == "Z" || letter == "X"
            if !gone { usleep(1_000) }
        }
        #expect(gone)
        // Reaped: by path it is gone, and nothing of it stays open.
        for _ in 0..<2_000 where files.stateLetter(thread: target) != nil { usleep(1_000) }
        #expect(files.stateLetter(thread: target) == nil)
        #expect(files.read(.syscall, thread: target) == nil)
        #expect(files.openCount == 0, "\(files.openCount) descriptors still open")
        #expect(files.stateLetter(thread: 0) == nil)
        #expect(files.read(.stat, thread: -5) == nil)
    }

    /// `thread`, which sleeps and wakes every 2 ms, is read asleep, with the
    /// system call it sleeps in. A loaded machine (ThreadSanitizer in CI) may
    /// find it awake again between the two reads: both are read again until the
    /// syscall line was read while it slept.
    private func expectReadAsleep(_ files: ProcTaskFiles, thread: Int32) throws {
        var letters: [Character?] = []
        var sleeping = ""
        for _ in 0..<200 {
            letters.append(files.stateLetter(thread: thread))
            if letters.last == "S" {
                sleeping = try #require(files.read(.syscall, thread: thread))
                if StackSampler.parseSyscall(sleeping) != nil { break }
            }
            usleep(1_000)
        }
        #expect(letters.last == "S", "\(letters)")
        #expect(StackSampler.parseSyscall(sleeping) != nil, "\(sleeping)")
    }

    @Test("more threads than the limit: every read still right, files closed when the table is full")
    func bounded() throws {
        let files = ProcTaskFiles()
        let me = stallcapture_current_tid()
        for round in 0..<(ProcTaskFiles.limit + 10) {
            // A thread number that does not exist (beyond pid_max) costs a failed open only.
            #expect(files.stateLetter(thread: Int32(4_194_304 + round)) == nil)
            #expect(files.stateLetter(thread: me) == "R")
        }
        #expect(files.openCount == 1, "only this thread's stat stays open: \(files.openCount)")
        // Many live threads: at most `limit` threads' files open at once.
        let stop = Locked(false)
        let tids = Locked<[Int32]>([])
        for _ in 0..<(ProcTaskFiles.limit * 2) {
            Thread {
                tids.withLock { $0.append(stallcapture_current_tid()) }
                while !stop.withLock({ $0 }) { usleep(2_000) }
            }.start()
        }
        defer { stop.withLock { $0 = true } }
        waitForCount: for _ in 0..<2_000 {
            if tids.withLock({ $0.count }) == ProcTaskFiles.limit * 2 { break waitForCount }
            usleep(1_000)
        }
        for tid in tids.withLock({ $0 }) {
            #expect(files.stateLetter(thread: tid) != nil)
            #expect(files.read(.syscall, thread: tid) != nil)
            #expect(files.openCount <= 2 * ProcTaskFiles.limit)
        }
    }
}

@Suite(
    "A running thread that blocks SIGPROF (in process)",
    .disabled(if: underThreadSanitizer, "ThreadSanitizer defers signals: a thread's mask is not its own"))
struct BlockedSignalTests {
    @Test("it is not signalled: the sample says why at once instead of waiting 100 ms for an answer")
    func notSignalled() throws {
        let stop = Locked(false)
        let tid = Locked<Int32>(0)
        Thread {
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, SIGPROF)
            pthread_sigmask(SIG_BLOCK, &set, nil)
            tid.withLock { $0 = stallcapture_current_tid() }
            var spins = 0
            while !stop.withLock({ $0 }) { spins &+= 1 }
            blackHoleForTests(spins)
        }.start()
        defer { stop.withLock { $0 = true } }
        var target: Int32 = 0
        while target == 0 {
            usleep(1_000)
            target = tid.withLock { $0 }
        }
        let files = ProcTaskFiles()
        let sigprof = UInt32(1) << UInt32(SIGPROF - 1)
        #expect(files.state(thread: target).map { $0.blocked & sigprof != 0 } == true)
        #expect(files.state(thread: stallcapture_current_tid()).map { $0.blocked & sigprof != 0 } == false)
        #expect(files.state(thread: 4_194_999) == nil)
        let context = SamplingContext()
        let started = ContinuousClock.now
        var reasons: [String] = []
        for _ in 0..<5 { reasons.append(context.backtrace(of: target).unavailableReason ?? "sampled") }
        let elapsed = ContinuousClock.now - started
        #expect(elapsed < .milliseconds(250), "5 samples took \(elapsed)")
        #expect(reasons.contains { $0.contains("SIGPROF blocked") }, "\(reasons)")
    }
}
