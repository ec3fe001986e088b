import CStallCapture
import Dispatch

/// Everything a detector's thread needs to sample a blocked thread and name its
/// frames: the sampler, the process's symbolicator, and what each address was
/// judged to be.
///
/// A sample is captured and unwound, judged by its functions' names from the
/// symbol tables (``FrameKind``: cheap, cached per address), and named in full
/// (files, lines, inlined frames: the debug information) only when a report or
/// a profile needs it.
///
/// `@unchecked Sendable` invariant: every method is called on its owner's one
/// serial ``DetectorWorker`` only (a detector's context on
/// `DetectorCore.detectorThread`, a profiler's on its sampling thread), so the mutable sampler, caches and counters
/// are never used by two threads at once (the symbolicator is shared and
/// thread-safe).
final class SamplingContext: @unchecked Sendable {
    private var sampler: StackSampler?
    private var installError: String?
    private let symbolicator: Symbolicator
    /// Calls and wrappers' tail jumps decoded in earlier samples (each read its
    /// code, PLT stub and GOT slot through the kernel), and the image map they
    /// belong to.
    private let code = StackUnwinder.CodeCache()
    private var codeGeneration = 0
    /// What the function at each address says about its thread.
    private var kinds: [Symbolicator.Key: FrameKind] = [:]
    /// CPU nanoseconds this context spent on work done once: naming addresses
    /// seen for the first time (in full, or by their symbols), and its first
    /// sample (the sampler set up, the stack's calls decoded for the first time:
    /// 4–18 ms in a debug build, which would otherwise empty the sampling budget
    /// and pause the first stall's profile for a quarter of a second).
    private(set) var oneTimeCost: Int64 = 0
    /// The awaiting callers the last sample read in full, and its thread: a
    /// stalled thread's next samples confirm them with one batch read.
    private var lastAwaits: (chain: AsyncContextChain, thread: Int32)?
    /// The task the last sample's thread ran, read then, with what identifies
    /// it (``TaskRecord/identity(at:layout:)``): a thread still in the same
    /// task is not read again.
    private var lastTask: (identity: TaskRecord.Identity, chain: TaskChain?)?

    init(symbolicator: Symbolicator = .shared) {
        self.symbolicator = symbolicator
    }

    /// How many `/proc` files this context keeps open for sampled threads.
    var openTaskFileCount: Int { sampler?.files.openCount ?? 0 }

    /// Closes the `/proc` files kept open for the sampled threads (a stall
    /// ended: the program may need the descriptors).
    func releaseFiles() {
        sampler?.files.closeAll()
    }

    /// Closes the files of every thread but `kept`: a search over every thread
    /// opened them, and the profile follows one thread.
    func releaseFiles(except kept: Int32?) {
        sampler?.files.closeAll(except: kept)
    }

    /// Installs the signal handler before the first stall and finds the
    /// concurrency runtime's job runners (``AsyncJobRunner``, under a
    /// millisecond: every sample this detector takes after its first look
    /// follows awaits, since the looks come after this on the detector's thread).
    func prepare() {
        _ = prepared()
        AsyncJobRunner.find()
        SwiftTaskLayout.locate()
    }

    private func prepared() -> StackSampler {
        if let sampler { return sampler }
        installError = StackSampler.install()
        let made = StackSampler(timeout: Self.signalTimeout)
        sampler = made
        return made
    }

    /// The id a report shows for kernel thread `thread`: the Linux tid. (Apple
    /// platforms have no sampler yet, so their reports carry no thread id rather
    /// than a wrong one.)
    static func reportedID(_ thread: Int32) -> UInt64? {
        #if os(Linux)
        return UInt64(UInt32(bitPattern: thread))
        #else
        return nil
        #endif
    }

    /// How long a signalled thread may take to answer: a running thread answers
    /// when it next gets a core, which on a loaded machine (load average 14 on 2
    /// cores) took over 100 ms. Threads that cannot answer (the signal blocked,
    /// the handler replaced) are never signalled.
    static let signalTimeout = Duration.milliseconds(500)

    /// How much of a sleeping thread's stack a sample copies first: most stacks
    /// end well within it (a thread's stack is followed by whatever is mapped
    /// above it, a malloc arena's heap for some: copying up to 256 KB of that
    /// was most of such a sample's cost). A copy that ends before the stack's
    /// root is taken again whole.
    static let firstKernelCopyBytes = 32 * 1_024

    /// Samples one thread and names its frames.
    func backtrace(of thread: Int32) -> StallBacktrace {
        switch sample(thread) {
        case .stack(let raw): name(raw)
        case .failed(let backtrace): backtrace
        case .detectorWork(let answeringProbe):
            .unavailable(
                "thread \(thread) was \(Self.detectorWork(answeringProbe))", threadID: Self.reportedID(thread))
        }
    }

    /// What a thread that ran a detector's code was doing, in a reason.
    static func detectorWork(_ answeringProbe: Bool) -> String {
        answeringProbe
            ? "running a detector's probe (the stall it answers was over)" : "running a stall detector's work"
    }

    /// Samples and unwinds one thread, naming nothing in full; `queue` is the
    /// watched queue's address, if known (``RawStack/runsQueue``).
    func sample(_ thread: Int32, queue: UInt? = nil) -> ThreadSample {
        guard SamplingSupport.isAvailable else { return .failed(SamplingSupport.unavailable) }
        guard let mark = DetectorThreads.quietMark(thread) else { return .detectorWork(answeringProbe: false) }
        let firstSample = sampler == nil ? StallProfiler.threadCPU() : nil
        defer { if let firstSample { oneTimeCost += StallProfiler.threadCPU() - firstSample } }
        var probeRan = false
        let sample = sampleAnyThread(thread, queue: queue, probeRan: &probeRan)
        guard DetectorThreads.stayedQuiet(thread, since: mark) else { return .detectorWork(answeringProbe: false) }
        return probeRan ? .detectorWork(answeringProbe: true) : sample
    }

    /// Runs `capture`, a capture of `thread`'s stack, and sets `probeRan` when the
    /// thread ran a detector's probe meanwhile. Only the capture is bracketed: a
    /// sample's other work (the sampler's setup, a first unwind's decoding: 100 ms
    /// and more in a fresh debug process) would take in the probes a healthy
    /// thread answered before its stall.
    private func bracketed<Captured>(
        _ thread: Int32, probeRan: inout Bool, _ capture: () -> Captured
    ) -> Captured {
        let before = stallcapture_probe_mark(thread)
        let captured = capture()
        if Self.ranProbe(before: before, after: stallcapture_probe_mark(thread)) { probeRan = true }
        return captured
    }

    /// Whether two reads of a thread's probe record (``stallcapture_probe_mark``)
    /// bracket a moment it ran a probe: either is odd (inside), or they differ.
    static func ranProbe(before: UInt64, after: UInt64) -> Bool {
        before & 1 == 1 || after & 1 == 1 || (after != 0 && after != before)
    }

    /// ``sample(_:queue:)``, whatever the thread runs.
    private func sampleAnyThread(_ thread: Int32, queue: UInt?, probeRan: inout Bool) -> ThreadSample {
        let sampler = prepared()
        let first = bracketed(thread, probeRan: &probeRan) {
            sampler.capture(
                thread: thread, kernelCopyLimit: Self.firstKernelCopyBytes, contexts: lastContexts(of: thread))
        }
        switch first {
        case .unavailable(let reason):
            return .failed(.unavailable(reason, threadID: Self.reportedID(thread)))
        case .runningUnsampled(let reason):
            return .failed(.unavailableWhileRunning(reason, threadID: Self.reportedID(thread)))
        case .copied(let copy, let signalled):
            if signalled, let installError {
                return .failed(.unavailable(installError, threadID: Self.reportedID(thread)))
            }
            var (raw, wentBeyond) = unwind(copy, thread: thread, queue: queue)
            raw.signalled = signalled
            guard !signalled, copy.truncated, wentBeyond || !summary(raw).reachesRoot else { return .stack(raw) }
            // Taken again whole; a thread that woke meanwhile is signalled, and
            // its whole stack of a moment later is the sample.
            let again = bracketed(thread, probeRan: &probeRan) {
                sampler.capture(thread: thread, contexts: lastContexts(of: thread))
            }
            guard case .copied(let whole, let signalledNow) = again,
                !signalledNow || installError == nil
            else { return .stack(raw) }
            var wholeRaw = unwind(whole, thread: thread, queue: queue).raw
            wholeRaw.signalled = signalledNow
            return .stack(wholeRaw)
        }
    }

    /// The contexts of the last sample's awaiting callers when it was
    /// `thread`'s: a `/proc` copy of `thread` reads their pairs with its stack
    /// (a search's copies of other threads read none).
    private func lastContexts(of thread: Int32) -> [UInt] {
        lastAwaits?.thread == thread ? lastAwaits?.chain.contexts ?? [] : []
    }

    /// Unwinds a captured stack; also whether the unwind followed the chain
    /// beyond the copy.
    private func unwind(_ copy: StackCopy, thread: Int32, queue: UInt?) -> (raw: RawStack, wentBeyond: Bool) {
        if SamplingTrace.printsCopies { SamplingTrace.copy(copy, thread: thread) }
        let task = readTask(copy)
        let ranges = symbolicator.code
        let generation = symbolicator.imageGeneration
        if codeGeneration != generation {
            code.removeAll()
            codeGeneration = generation
        }
        let blocks = MemoryBlocks()
        let (symbolicator, code) = (self.symbolicator, self.code)
        let unwinder = StackUnwinder(
            copy: copy, isText: ranges.isText,
            readWord: { blocks.word(at: $0) },
            exactStart: { candidate, inner, innerIsReturnAddress in
                Self.exactStart(
                    of: inner, isReturnAddress: innerIsReturnAddress, calledFrom: candidate, ranges: ranges,
                    executableStart: symbolicator.functionStart(of:isReturnAddress:),
                    libraryStart: { address in
                        if let known = code.libraryStart(at: address) { return known }
                        let start = ElfSymbolTable.function(at: address)?.start
                        code.remember(libraryStart: start, at: address)
                        return start
                    })
            }, codeCache: code)
        // Async contexts lie next to each other in the task allocator's slabs:
        // a page a read (a 50-await chain in two or three system calls).
        let contexts = MemoryBlocks(blockWords: 512)
        let runners = AsyncJobRunner.ranges
        let (frames, awaits, cutAt) = unwinder.insertingAwaits(
            into: unwinder.unwind(), readContextWord: { contexts.word(at: $0) }, remembered: lastAwaits?.chain,
            readPairs: { StackSampler.readPairs(at: $0, between: $1) },
            isJobRunner: { AsyncJobRunner.contains(returnAddress: $0, in: runners) },
            schedulingNow: copy.scheduling == nil ? nil : { [sampler] in sampler?.scheduling(of: thread) },
            freshContextReader: copy.scheduling == nil
                ? nil
                : {
                    let fresh = MemoryBlocks(blockWords: 512)
                    return { fresh.word(at: $0) }
                })
        if let awaits, awaits.cut == nil { lastAwaits = (awaits, thread) }
        let held = queue.map { copy.words.contains($0) } ?? false
        var raw = RawStack(
            thread: thread, frames: frames, copyTruncated: copy.truncated || unwinder.signalContextUnread, queue: queue,
            currentQueue: copy.queue ?? (queue == nil ? nil : ThreadPointers.currentQueue(of: thread)),
            wordsHoldQueue: held || !(unwinder.wentBeyondCopy || frames.contains { $0.isSignalReturn }) ? held : nil)
        raw.awaitsCut = awaits?.cut
        raw.awaitsCutIndex = cutAt
        raw.task = confirmed(task, in: copy, thread: thread)
        raw.time = copy.time
        raw.answerDelay = copy.answerDelay
        return (raw, unwinder.wentBeyondCopy)
    }

    /// A task read right after a sample, before its stack is unwound.
    private struct TaskRead {
        var address: UInt
        var identity: TaskRecord.Identity
        var chain: TaskChain?
    }

    /// The task a sample's thread ran and its parents, read as soon as the
    /// stack is copied, while the thread is most likely still in it (a report
    /// names its stack much later). A task read for the last sample, the same
    /// by its first words, is not read again.
    private func readTask(_ copy: StackCopy) -> TaskRead? {
        guard let address = copy.task, address != 0, let layout = SwiftTaskLayout.verified,
            let identity = TaskRecord.identity(at: address, layout: layout)
        else { return nil }
        if let lastTask, lastTask.identity == identity {
            return TaskRead(address: address, identity: identity, chain: lastTask.chain)
        }
        let (tasks, cut) = TaskRecord.chain(at: address, layout: layout, readWord: MemoryBlocks().word(at:))
        let chain = tasks.isEmpty ? nil : TaskChain(tasks: tasks, cut: cut)
        lastTask = (identity, chain)
        return TaskRead(address: address, identity: identity, chain: chain)
    }

    /// The task read, when the thread still runs it once its stack is
    /// unwound: its slot, read again through its thread pointer, holds it
    /// still, under the same id. A task that completed meanwhile has left the
    /// slot (its name record is gone then, its memory perhaps not yet); one
    /// that is no longer the thread's is not shown with the thread's stack.
    private func confirmed(_ read: TaskRead?, in copy: StackCopy, thread: Int32) -> TaskChain? {
        guard let read, let pointer = copy.threadPointer, let layout = SwiftTaskLayout.verified else { return nil }
        var now: UInt = 0
        guard stallcapture_task_of_thread(thread, pointer, &now) == 1, now == read.address,
            TaskRecord.identity(at: read.address, layout: layout) == read.identity
        else { return nil }
        return read.chain
    }

    /// Where the function holding `inner` starts, for a call from `candidate`
    /// in the main executable that must have led there (directly, or through
    /// tail jumps to exactly that start): from the executable's symbol table
    /// when `inner` is in it, else from the library's symbol whose extent
    /// holds `inner` (its size says so). Nil when that cannot be known (a
    /// caller in a library; code no sized symbol covers, such as a stripped
    /// library's local functions): the unwinder then takes a callee that starts
    /// near enough before `inner`. That looser rule let a stale return address
    /// into a function whose tail calls end in `swift_release` prove itself the
    /// caller of `swift_slowAlloc`, 200 KB further on: a frame made up in a
    /// stack read while the thread waited for `malloc`'s lock.
    static func exactStart(
        of inner: UInt, isReturnAddress: Bool, calledFrom candidate: UInt, ranges: CodeRanges,
        executableStart: (UInt, Bool) -> UInt?, libraryStart: (UInt) -> UInt?
    ) -> UInt? {
        guard ranges.isInExecutable(candidate) else { return nil }
        if ranges.isInExecutable(inner) { return executableStart(inner, isReturnAddress) }
        return libraryStart(isReturnAddress ? inner &- 1 : inner)
    }

    /// Names a sampled stack in full (awaiting callers not named yet from their
    /// symbols alone when `awaitsInFull` is false: ``Symbolicator/symbolicate(_:awaitsInFull:)``).
    func name(_ raw: RawStack, awaitsInFull: Bool = true) -> StallBacktrace {
        let before = StallProfiler.threadCPU()
        let frames = StackShape.prune(
            Self.markSignalFrames(symbolicator.symbolicate(raw.frames, awaitsInFull: awaitsInFull), raw: raw.frames))
        oneTimeCost += StallProfiler.threadCPU() - before
        return StallBacktrace(
            frames: frames, threadID: Self.reportedID(raw.thread), unavailableReason: nil,
            isTruncated: raw.copyTruncated && !StackShape.reachesRoot(frames), awaitsCut: raw.awaitsCut?.reason
        ).naming(raw.task)
    }

    /// Starts naming a sampled stack in full in the background (see
    /// ``Symbolicator/prefetch(_:)``); returns at once.
    func prefetchNames(_ frames: [RawFrame]) {
        symbolicator.prefetch(frames)
    }

    /// Names sampled stacks in full, for a profile: the frames found only by a
    /// scan go first unless the chain does not reach the root (as in a report).
    func names(_ stacks: [[RawFrame]], awaitsInFull: Bool = true) -> [[StackFrame]] {
        let before = StallProfiler.threadCPU()
        let named = stacks.map {
            StackShape.prune(
                Self.markSignalFrames(symbolicator.symbolicate($0, awaitsInFull: awaitsInFull), raw: $0))
        }
        oneTimeCost += StallProfiler.threadCPU() - before
        return named
    }

    /// Whether the thread was running a job of the watched queue (nil when no
    /// queue is watched). A signalled thread says which queue it drains; a job
    /// that waits inside another queue's `sync` drains that one, and counts when
    /// the watched queue's address is on its stack below a second callout. A
    /// thread read from `/proc` is judged by its stack's words alone.
    func runsQueue(_ raw: RawStack) -> Bool? {
        guard let queue = raw.queue else { return nil }
        guard let current = raw.currentQueue else { return raw.wordsHoldQueue }
        return current == queue || (raw.wordsHoldQueue == true && summary(raw).callouts >= 2)
    }

    /// Whether a thread's job may be taken as the watched queue's: always when no
    /// queue is watched (an event loop's own thread); when the thread is known
    /// to run it; and, for the thread that answered the queue's last probe,
    /// when it cannot be told (a stack read through a signal frame or beyond the
    /// copy, such as a job stalled in its own signal handler). Any other thread
    /// that cannot tell may run another queue's job: one detector per queue
    /// blamed its neighbours' functions that way.
    func isThisQueue(_ raw: RawStack, lastAnswering: Bool) -> Bool {
        guard raw.queue != nil else { return true }
        let runs = runsQueue(raw)
        return runs == true || (lastAnswering && runs == nil)
    }

    /// The kernel's signal return trampoline named as a debugger names it: the
    /// frames above it ran in a signal handler.
    static func markSignalFrames(_ frames: [StackFrame], raw: [RawFrame]) -> [StackFrame] {
        let trampolines = Set(raw.filter(\.isSignalReturn).map(\.address))
        guard !trampolines.isEmpty else { return frames }
        return frames.map { frame in
            guard trampolines.contains(frame.address), !frame.isInlined else { return frame }
            return StackFrame(
                address: frame.address, function: "<signal handler called>", file: nil, line: nil, image: frame.image,
                isUncertain: frame.isUncertain, imageOffset: frame.imageOffset)
        }
    }

    /// What a sampled stack's functions say about its thread (names from the
    /// symbol tables, each address judged once).
    func summary(_ raw: RawStack) -> StackSummary {
        let keys = raw.frames.enumerated().map {
            Symbolicator.Key(address: $0.element.address, isReturnAddress: $0.element.isReturnAddress(at: $0.offset))
        }
        let missing = keys.filter { kinds[$0] == nil }
        if !missing.isEmpty {
            let before = StallProfiler.threadCPU()
            let names = symbolicator.functionNames(missing)
            oneTimeCost += StallProfiler.threadCPU() - before
            if kinds.count > 100_000 { kinds.removeAll() }
            // An unnamed address is judged again next time: its naming may
            // have failed, and the symbolicator caches a lasting lack of a name.
            for (key, name) in zip(missing, names) where name != nil { kinds[key] = FrameKind(name: name) }
        }
        return StackSummary(kinds: keys.map { kinds[$0] ?? [] }, certain: raw.frames.map { !$0.isUncertain })
    }

    /// What looking for a target's blocked thread found: the thread running the
    /// target's job (its raw stack), or why none was found; for the cooperative
    /// pool, every thread of it running its work (``findPoolThreads()``).
    struct Search {
        var found: RawStack?
        var failure: StallBacktrace
        var others: [RawStack] = []
        /// The found thread's activities, when read before its capture.
        var activities: [String]? = nil
        /// Whether the thread that answers the target's probes was found running
        /// a detector's probe: not held in a job at that moment, so the look
        /// that sampled it confirms no stall (a later look may).
        var answeringProbe = false
    }

    /// A search's result, named (``named(_:)``), for a `.started` report.
    struct BlockedThread {
        /// The chosen thread's backtrace, or why there is none.
        var backtrace: StallBacktrace
        /// The named samples of the threads that ran the job, by thread.
        var samples: [Int32: StallBacktrace]
        /// The chosen thread's activities, read right after its stack (before
        /// naming, which may outlast the stall).
        var activities: [String]
    }

    /// What a search found, named: the chosen backtrace, the named samples of
    /// the threads that ran the job, and the chosen thread's activities (read
    /// before naming, if the search did not read them before its capture). The
    /// search may have been made by another context: naming reads no sampler
    /// state.
    func named(_ search: Search, awaitsInFull: Bool = true) -> BlockedThread {
        guard let found = search.found else {
            return BlockedThread(backtrace: search.failure, samples: [:], activities: [])
        }
        let activities = search.activities ?? ActivityRecord.activities(ofThread: Self.reportedID(found.thread))
        let named = name(found, awaitsInFull: awaitsInFull)
        var samples = [found.thread: named]
        for other in search.others where other.thread != found.thread {
            samples[other.thread] = name(other, awaitsInFull: awaitsInFull)
        }
        return BlockedThread(backtrace: named, samples: samples, activities: activities)
    }

    /// Finds the thread that runs the target's job, naming nothing in full. For
    /// the pool, every thread of it running its work. For a watched queue
    /// or the main queue (`queue`, from the probes' answers), libdispatch's
    /// drain lock names its thread (``QueueDrainer``), whatever the number of
    /// threads: that thread is taken; when it says no thread drains the queue,
    /// none is (the failure says so). Otherwise (no queue, or a drain lock that
    /// cannot be read): the main thread for the main run loop; for a custom
    /// executor, see `findCustomExecutorThread`; otherwise the first thread seen running a job of the watched queue,
    /// among the candidates in order (the main thread for the main queue, the
    /// thread that answered the last probe, then every other thread). A thread
    /// running another queue's job (a worker that answered this queue's probe
    /// earlier) is never taken: `queue`, the watched queue's address, tells them
    /// apart. When none is found, `failure` says why: never another thread's
    /// stack. With `candidatesOnly`, the other threads are not tried (the
    /// profile's samples before the threshold, which must not hold up the
    /// detector's looks).
    func find(target: StallDetector.Target, lastAnswering: Int32?, queue: UInt?, candidatesOnly: Bool) -> Search {
        guard SamplingSupport.isAvailable else { return Search(found: nil, failure: SamplingSupport.unavailable) }
        if case .cooperativePool = target { return findPoolThreads() }
        var trail: [String]? = SamplingTrace.isEnabled ? [] : nil
        defer {
            if let trail {
                let head = "\(target) queue=\(queue.map { String($0, radix: 16) } ?? "nil") last=\(lastAnswering ?? 0)"
                SamplingTrace.find(([head] + trail).joined(separator: " "))
            }
        }
        if let search = findByDrainer(target: target, queue: queue, trail: &trail) { return search }
        if case .custom = target {
            let search = findCustomExecutorThread(
                lastAnswering: lastAnswering, queue: queue, candidatesOnly: candidatesOnly, trail: &trail)
            trail?.append("-> \(search.found?.thread ?? 0)")
            return search
        }
        return findAmongThreads(
            target: target, lastAnswering: lastAnswering, queue: queue, candidatesOnly: candidatesOnly, trail: &trail)
    }

    /// The search by libdispatch's own record of the thread that drains the
    /// watched queue (``QueueDrainer``), when it knows: that thread, or no
    /// thread at all. Nil when it does not know.
    private func findByDrainer(target: StallDetector.Target, queue: UInt?, trail: inout [String]?) -> Search? {
        let drained = target.ownsProbeQueue ? queue.map(QueueDrainer.answer(for:)) ?? .unknown : .unknown
        trail?.append("drainer=\(drained)")
        switch drained {
        case .thread(let drainer):
            let search = sampleDrainer(drainer, queue: queue)
            trail?.append("-> \(search.found?.thread ?? 0)")
            return search
        case .noThread:
            // libdispatch says no thread runs the queue's job: any thread's stack
            // would be another target's.
            return Search(found: nil, failure: Self.noJobFound(firstFailure: nil, otherJobs: 0))
        case .unknown:
            return nil
        }
    }

    /// The search among the candidates (the main thread, the thread that
    /// answered last), then, for a heartbeat target and unless
    /// `candidatesOnly`, every other thread of the process.
    private func findAmongThreads(
        target: StallDetector.Target, lastAnswering: Int32?, queue: UInt?, candidatesOnly: Bool,
        trail: inout [String]?
    ) -> Search {
        let mainThread = ProcessFacts.mainThreadID
        var candidates: [Int32] = []
        switch target {
        case .mainRunLoop: candidates = [mainThread]
        case .mainQueue: candidates = [mainThread] + (lastAnswering.map { [$0] } ?? [])
        case .queue, .custom, .cooperativePool: candidates = lastAnswering.map { [$0] } ?? []
        }
        var firstFailure: StallBacktrace?
        var otherJobs = 0
        /// Samples `threads`; returns the first that runs the queue's job.
        func look(_ threads: [Int32], alone: Bool, candidates: Bool) -> RawStack? {
            for thread in threads {
                switch sample(thread, queue: queue) {
                case .detectorWork:
                    trail?.append("\(thread):detector")
                    continue
                case .failed(let backtrace):
                    trail?.append("\(thread):failed")
                    if firstFailure == nil { firstFailure = backtrace }
                case .stack(let raw):
                    // A thread that says it drains the queue runs its job, even
                    // when the copy of its stack ends before the job's frames.
                    let runsJob = summary(raw).runsJob
                    let takes =
                        alone || (raw.currentQueue != nil && runsQueue(raw) == true)
                        || (runsJob && isThisQueue(raw, lastAnswering: candidates))
                    trail?.append(SamplingTrace.verdict(thread, raw, runsJob: runsJob, took: takes))
                    if takes { return raw }
                    if runsJob { otherJobs += 1 }
                }
            }
            return nil
        }
        let alone = !target.usesHeartbeat && candidates.count == 1
        var found = look(candidates, alone: alone, candidates: true)
        if found == nil && target.usesHeartbeat && !candidatesOnly {
            found = look(otherThreads(excluding: candidates), alone: false, candidates: false)
        }
        trail?.append("-> \(found?.thread ?? 0)")
        guard let found else {
            return Search(found: nil, failure: Self.noJobFound(firstFailure: firstFailure, otherJobs: otherJobs))
        }
        return Search(found: found, failure: .unavailable(""))
    }

    /// The thread that drains the watched queue, by libdispatch's own record
    /// (``QueueDrainer``): sampled, and taken without judging its frames.
    private func sampleDrainer(_ drainer: Int32, queue: UInt?) -> Search {
        guard drainer != stallcapture_current_tid() else {
            return Search(found: nil, failure: .unavailable("the queue is drained by the detector's own thread"))
        }
        // Labels read before the capture: read after it, they may be those of
        // what the thread did once the stall was over.
        let activities = ActivityRecord.activities(ofThread: Self.reportedID(drainer))
        switch sample(drainer, queue: queue) {
        case .stack(let raw):
            return Search(found: raw, failure: .unavailable(""), activities: activities)
        case .failed(let backtrace):
            return Search(found: nil, failure: backtrace)
        case .detectorWork(let answeringProbe):
            return Search(
                found: nil,
                failure: .unavailable(
                    "thread \(drainer), which drains the queue, was \(Self.detectorWork(answeringProbe))",
                    threadID: Self.reportedID(drainer)),
                answeringProbe: answeringProbe)
        }
    }

    /// The process's other threads that may run a job (not a detector's, the stop
    /// witness's or SafeTimers' scheduler's), those asleep first: every one, as a
    /// last resort when the queue's drain lock cannot be read.
    private func otherThreads(excluding excluded: [Int32]) -> [Int32] {
        let own = stallcapture_current_tid()
        let others = ProcessFacts.threads().filter { id, name in
            id != own && !excluded.contains(id) && !Self.ignoredThreadNames.contains(name)
                && !DetectorThreads.contains(id)
        }.map(\.id)
        return Self.sleepersFirst(others)
    }

    /// Why no thread was found running the queue's job.
    private static func noJobFound(firstFailure: StallBacktrace?, otherJobs: Int) -> StallBacktrace {
        if let firstFailure, let reason = firstFailure.unavailableReason {
            let text = "no thread was seen running this queue's job; one could not be sampled: \(reason)"
            return firstFailure.whileRunning
                ? .unavailableWhileRunning(text, threadID: firstFailure.threadID)
                : .unavailable(text, threadID: firstFailure.threadID)
        }
        let others = otherJobs == 0 ? "" : " (\(otherJobs) ran other queues' jobs)"
        return .unavailable(
            "no thread was seen running this queue's job\(others): the queue may be suspended, or waiting for a thread")
    }

    /// A custom executor's thread is the one that last ran a probe (an event
    /// loop's thread): it is sampled first, and taken unless it waits for work
    /// or runs another queue's job. Failing that, for an executor that posts to a
    /// dispatch queue (whose drain lock is not read: see
    /// ``StallDetector/Target/ownsProbeQueue``), the first other thread
    /// running that queue's job is taken (a dispatch queue's jobs move from
    /// worker to worker); an executor with a thread of its own (no queue) is
    /// never looked for elsewhere: any other thread's job would be another
    /// target's. Failing that, the failure says the executor's thread waits for
    /// work, or that it ran a detector's probe or work while it was sampled (the
    /// second look then reports the stall without a stack). Never the
    /// detector's own thread, never an idle thread's stack.
    private func findCustomExecutorThread(
        lastAnswering: Int32?, queue: UInt?, candidatesOnly: Bool, trail: inout [String]?
    ) -> Search {
        let own = stallcapture_current_tid()
        guard let thread = lastAnswering, thread != own else {
            let unknown =
                lastAnswering == nil
                ? "no probe has run yet, so the executor's thread is unknown"
                : "the last probe ran inside `post`, on the detector's own thread"
            return Search(found: nil, failure: .unavailable(unknown))
        }
        var failure = StallBacktrace.unavailable(
            "the executor's thread \(thread) is waiting for work, and no other thread was seen running its job",
            threadID: Self.reportedID(thread))
        // The worker that ran the last probe may be doing a detector's work now
        // (detectors' queues run on the same workers): never its stack.
        var answering = false
        switch sample(thread, queue: queue) {
        case .detectorWork(let answeringProbe):
            answering = answeringProbe
            // Not "waiting for work": a thread that answered a probe while it was
            // sampled (a starved loop finishing its job) was not seen waiting.
            trail?.append("\(thread):detector")
            failure = .unavailable(
                "the executor's thread \(thread) was \(Self.detectorWork(answeringProbe)), and no other thread was seen running its job",
                threadID: Self.reportedID(thread))
        case .failed(let backtrace):
            trail?.append("\(thread):failed")
            failure = backtrace
        case .stack(let raw):
            let takes = isThisQueue(raw, lastAnswering: true) && !isIdle(raw)
            trail?.append(SamplingTrace.verdict(thread, raw, runsJob: summary(raw).runsJob, took: takes))
            if takes { return Search(found: raw, failure: failure) }
        }
        if let queue, let drainer = drainerHint(of: queue, excluding: [thread, own], trail: &trail) {
            return Search(found: drainer, failure: failure)
        }
        guard !candidatesOnly, queue != nil else {
            return Search(found: nil, failure: failure, answeringProbe: answering)
        }
        for other in otherThreads(excluding: [thread]) {
            let sampled = sample(other, queue: queue)
            if case .failed(let backtrace) = sampled {
                trail?.append("\(other):failed(\(backtrace.unavailableReason ?? ""))")
            }
            guard case .stack(let raw) = sampled else { continue }
            let runsJob = summary(raw).runsJob
            let takes = runsJob && isThisQueue(raw, lastAnswering: false)
            if runsJob { trail?.append(SamplingTrace.verdict(other, raw, runsJob: runsJob, took: takes)) }
            if takes { return Search(found: raw, failure: failure) }
        }
        return Search(found: nil, failure: failure, answeringProbe: answering)
    }

    /// The thread a custom executor's queue (the one its probes answered on)
    /// names as its drainer, when that thread is seen running the queue's job.
    /// The queue is not the detector's to keep alive, so its drain lock is only a
    /// hint: a freed queue's memory may name any thread, or none that exists,
    /// and the thread is taken only when its own record says it drains that
    /// queue (the strictest rule a search applies). One read and one sample, where
    /// the search would signal every running thread in turn.
    private func drainerHint(of queue: UInt, excluding excluded: [Int32], trail: inout [String]?) -> RawStack? {
        // A thread id that is not this process's fails to be signalled or read;
        // a detector's thread is no stack (``sample(_:queue:)``).
        guard case .thread(let drainer) = QueueDrainer.answer(for: queue), !excluded.contains(drainer),
            case .stack(let raw) = sample(drainer, queue: queue)
        else { return nil }
        // Only the thread's own record of the queue it drains: words of the
        // queue's address on its stack may be left from an earlier job.
        let runsJob = summary(raw).runsJob
        let takes = runsJob && raw.currentQueue == queue
        trail?.append("hint=" + SamplingTrace.verdict(drainer, raw, runsJob: runsJob, took: takes))
        return takes ? raw : nil
    }

    /// Every thread of the pool running its work: the pool's blocked threads,
    /// Swift jobs first; the first is `found`. The pool's threads are
    /// libdispatch's workers, named after their root queue (the name's last 15
    /// bytes, "…qos…"). On Linux the probe's (medium-priority) pool is the
    /// default-QoS global queue's threads ("…default-qos"), where
    /// `DispatchQueue.global()` blocks run too
    /// (``StackShape/poolSharesGlobalQueue``): a block running there holds the
    /// pool as a task does, and a task of another priority runs on another
    /// pool, taken only when the probe's pool shows nothing. Every worker is
    /// looked at, and no other thread: a server's own threads (event loops,
    /// drivers' threads, idle pools), however many, cost nothing here.
    private func findPoolThreads() -> Search {
        let own = stallcapture_current_tid()
        // The main thread is never a pool thread (it runs an async `main` or the
        // main actor's jobs with the same frames).
        let mainThread = ProcessFacts.mainThreadID
        let shared = StackShape.poolSharesGlobalQueue
        let threads = ProcessFacts.threads().filter { id, name in
            id != own && id != mainThread && name.contains("qos")
        }
        var running: [RawStack] = []
        var blocks: [RawStack] = []
        var otherPools: [RawStack] = []
        for (thread, name) in threads {
            guard case .stack(let raw) = sample(thread) else { continue }
            let summary = summary(raw)
            let probesPool = !shared || name.hasSuffix("default-qos")
            if summary.runsSwiftJob {
                if probesPool { running.append(raw) } else { otherPools.append(raw) }
            } else if shared && probesPool && summary.runsJob && !summary.looksIdle {
                blocks.append(raw)
            }
        }
        let pool = running + blocks
        let failure =
            shared ? "no thread of the pool was running a Swift job or a block" : "no thread was running a Swift job"
        return Search(
            found: (pool + otherPools).first, failure: .unavailable(failure), others: pool.isEmpty ? otherPools : pool)
    }

    /// Whether the kernel says thread `thread` sleeps in `epoll_wait` (an event
    /// loop parked), read through the files this context keeps open.
    func isInEventWait(_ thread: Int32) -> Bool {
        sampler.map { ThreadState.isInEventWait(thread: thread, files: $0.files) }
            ?? ThreadState.isInEventWait(thread: thread)
    }

    /// Whether a sampled thread waits for work: its stack says so, or (Linux) the
    /// kernel says it sleeps in `epoll_wait` with no job on its stack (an event
    /// loop parked; the C library's frames may have no names).
    func isIdle(_ raw: RawStack) -> Bool {
        let summary = summary(raw)
        if summary.looksIdle { return true }
        return !summary.runsJob && ThreadState.isInEventWait(thread: raw.thread)
    }

    /// Whether a sampled thread waits for work: its stack says so, or (Linux) the
    /// kernel says it sleeps in `epoll_wait` with no job on its stack (an event
    /// loop parked; the C library's frames may have no names).
    static func isIdle(_ sample: StallBacktrace, thread: Int32) -> Bool {
        if StackShape.looksIdle(sample.frames) { return true }
        return !StackShape.runsJob(sample.frames) && ThreadState.isInEventWait(thread: thread)
    }

    /// Whether a sampled thread was woken from a wait and had not run on: its
    /// stack sleeps until woken (``StackShape/waitsToBeWoken(_:)``) while the
    /// kernel had it runnable (`runnable`: it was signalled, as a runnable thread
    /// is, or its state is R after the sample). An executor with a thread of its
    /// own, parked on a condition and woken by its probe on a crowded machine,
    /// looks so until it gets a core; so does a job whose lock was just handed
    /// to it. Neither is seen running a job: the stall waits for a second look.
    /// `runnable` is asked only for such a stack.
    static func isWokenWaiter(_ sample: StallBacktrace, runnable: @autoclosure () -> Bool) -> Bool {
        StackShape.waitsToBeWoken(sample.frames) && runnable()
    }

    /// `threads` with those asleep in the kernel first, in their order, then the
    /// running ones. A sleeping thread is read without a signal; a running one
    /// gets a `SIGPROF`, which cuts short a long system call it is in (a big
    /// `read` returns what it has), so bystanders are signalled only when no
    /// sleeping thread turned out to run the job.
    /// Among running threads, those that spent more of their time in user code
    /// than in the kernel come first (a spinning job before a thread copying a big
    /// `read`).
    static func sleepersFirst(_ threads: [Int32]) -> [Int32] {
        #if os(Linux)
        var sleeping: [Int32] = []
        var running: [(thread: Int32, inKernel: Bool)] = []
        for thread in threads {
            guard let stat = ProcFile.read("/proc/self/task/\(thread)/stat"),
                let close = stat.lastIndex(of: ")")
            else { continue }
            // After the command: state (field 3), …, utime (14), stime (15).
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 12, fields[0] == "R" else {
                sleeping.append(thread)
                continue
            }
            running.append((thread, (Int(fields[12]) ?? 0) > (Int(fields[11]) ?? 0)))
        }
        return sleeping + running.filter { !$0.inKernel }.map(\.thread) + running.filter(\.inKernel).map(\.thread)
        #else
        return threads
        #endif
    }

    /// Threads that are never the blocked one: detectors, the stop witness and
    /// SafeTimers' scheduler.
    private static let ignoredThreadNames: Set<String> = ["StallDetector", "StallStopWitnes", "SafeTimers"]
}
