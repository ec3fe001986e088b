extension StackUnwinder {
    /// The awaits above the async function the thread runs, inserted after its
    /// frame: the frames ``unwind()`` returned, with the resume addresses of
    /// its ``AsyncContextChain`` placed before the job runner's frame (marked
    /// ``RawFrame/isAwaitResume``); the chain itself (nil when no frame runs
    /// async code); and where, among the frames returned, the first chain cut
    /// short stops (the index of its job runner's frame), if one is.
    /// Contexts are read through `readContextWord` (by default ``readWord``);
    /// a `remembered` chain (the last sample's) is confirmed with one batch
    /// read instead (``AsyncContextChain/confirming(_:from:readPairs:)``), or
    /// against the pairs a `/proc` copy read with the stack while the thread
    /// held still (``StackCopy/contextPairs``), with nothing read again.
    ///
    /// The async frame is the one whose record's return address lies in the
    /// runtime's job runner (``AsyncJobRunner``); its context is the word
    /// below that record. A job may run another task's job inside it (a task
    /// started on an executor that runs jobs at once, `runSynchronously`):
    /// each task's async frame gets its own awaits, and the chain returned is
    /// the innermost one's, with the first cut of the outer ones when it has
    /// none. A job of the same task run inside (its context among the awaits
    /// shown) adds none, and neither does an outer frame whose context slot
    /// holds no context (a runtime entry the job tail-called). An async frame
    /// whose record lies beyond the copy (the unwind read it from memory) gets
    /// no awaits and is cut as ``AsyncContextChain/Cut/beyondCopy``.
    ///
    /// Contexts are read after the copy, while the thread
    /// may run on, and a task allocates its contexts at the same addresses
    /// again and again: a function that returned and called another, just as
    /// deep, leaves the record and the context's address as they were, with
    /// other callers in the contexts. So after the chain are read again, from
    /// the live stack, the record's words and the return address into the
    /// async function from the frame it calls (which tells one function from
    /// another: a return into the same function from another call site still
    /// holds); when they changed, no await is shown
    /// (``AsyncContextChain/Cut/movedOn``). A thread read while it slept has
    /// scheduling counts (``StackCopy/scheduling``; `schedulingNow` reads them
    /// again): if it ran since the copy, the chain is read once more (through a
    /// reader from `freshContextReader`, which remembers nothing read before),
    /// and kept if the thread held still meanwhile and the stack's words still
    /// hold; a reading the thread ran through is tried again, up to
    /// ``chainRereads`` times (a thread woken from a short sleep runs a few
    /// microseconds, then sleeps again, a loop polling a clock). None
    /// of this tells apart two call paths that end in the same function at the
    /// same depth, taken in turn by a running task (a known limit: the other
    /// path's callers may show).
    func insertingAwaits(
        into frames: [RawFrame], readContextWord: ((UInt) -> UInt?)? = nil,
        remembered: AsyncContextChain? = nil, readPairs: PairReader? = nil,
        isJobRunner: (UInt) -> Bool = { AsyncJobRunner.contains(returnAddress: $0) },
        schedulingNow: (() -> String?)? = nil, freshContextReader: (() -> (UInt) -> UInt?)? = nil
    ) -> (frames: [RawFrame], chain: AsyncContextChain?, cutAt: Int?) {
        let slots = scratch.frameSlots
        guard slots.count == frames.count else { return (frames, nil, nil) }
        let reading = ChainReading(
            readContextWord: readContextWord, readPairs: readPairs, schedulingNow: schedulingNow,
            freshContextReader: freshContextReader)
        var (result, next) = ([RawFrame](), 0)
        var (innermost, outerCut, cutAt) = (AsyncContextChain?.none, AsyncContextChain.Cut?.none, Int?.none)
        // The contexts shown so far (most stacks have one job runner frame: no
        // set is built for it).
        var shown: [[UInt]] = []
        for index in frames.indices.dropFirst() {
            let returnSlot = slots[index]
            guard returnSlot >= 2, scratch.recordSlots.contains(returnSlot), isJobRunner(frames[index].address)
            else { continue }
            let contextSlot = returnSlot - 1 - Int(AsyncContextChain.contextOffsetBelowRecord) / 8
            // A record the unwind read beyond the copy (the chain went on in
            // memory) has no copied words to hold the live stack against: its
            // awaits are said to be missing.
            let beyondCopy = returnSlot >= copy.words.count
            guard contextSlot >= 0, beyondCopy || copy.words[contextSlot] != 0 else {
                if innermost == nil { return (frames, nil, nil) }
                continue
            }
            // A job of the same task run inside another (its context is one of
            // the awaits shown): its callers are shown already.
            guard beyondCopy || !shown.contains(where: { $0.contains(copy.words[contextSlot]) }) else { continue }
            let calleeSlot = index >= 2 && slots[index - 1] >= 0 ? slots[index - 1] : nil
            let chain =
                beyondCopy
                ? AsyncContextChain(resumeAddresses: [], cut: .beyondCopy)
                : readChain(
                    contextSlot: contextSlot, returnSlot: returnSlot, calleeSlot: calleeSlot,
                    remembered: innermost == nil ? remembered : nil, reading)
            // An outer job's context is live while its frame is on the stack, so
            // a first word that is no context says its frame is no async
            // function's (a runtime entry such as `swift_task_switch`, which
            // the job tail-called to hop onto an executor that ran it at once).
            if innermost != nil, chain.resumeAddresses.isEmpty, let cut = chain.cut, cut != .movedOn, cut != .beyondCopy
            {
                continue
            }
            result += frames[next..<index]
            result += chain.resumeAddresses.map { RawFrame(address: $0, isUncertain: false, isAwaitResume: true) }
            next = index
            if chain.cut != nil, cutAt == nil { cutAt = result.count }
            if innermost == nil { innermost = chain } else if outerCut == nil { outerCut = chain.cut }
            shown.append(chain.contexts)
        }
        guard var chain = innermost else { return (frames, nil, nil) }
        result += frames[next...]
        if chain.cut == nil { chain.cut = outerCut }
        return (result, chain, cutAt)
    }

    /// Reads the two words at each of the addresses given, between two
    /// readings of the stack's words in the span given, in one system call
    /// (``StackSampler/readPairs(at:between:)``).
    typealias PairReader = ([UInt], (address: UInt, words: Int)) -> (pairs: [UInt], before: [UInt], after: [UInt])?

    /// How many times a sleeping thread's chain is read again when the thread
    /// ran through the reading before.
    static let chainRereads = 3

    /// How ``insertingAwaits(into:readContextWord:remembered:readPairs:isJobRunner:schedulingNow:freshContextReader:)``
    /// reads contexts and the thread's scheduling counts.
    private struct ChainReading {
        var readContextWord: ((UInt) -> UInt?)?
        var readPairs: PairReader?
        var schedulingNow: (() -> String?)?
        var freshContextReader: (() -> (UInt) -> UInt?)?
    }

    /// The chain of the async frame whose context lies at `contextSlot`, below
    /// its record (return address at `returnSlot`), called into by the frame
    /// whose return address is at `calleeSlot`: read, and confirmed as the
    /// sample's (see ``insertingAwaits(into:readContextWord:remembered:readPairs:isJobRunner:schedulingNow:freshContextReader:)``),
    /// or cut as ``AsyncContextChain/Cut/movedOn``.
    private func readChain(
        contextSlot: Int, returnSlot: Int, calleeSlot: Int?, remembered: AsyncContextChain?, _ reading: ChainReading
    ) -> AsyncContextChain {
        let context = copy.words[contextSlot]
        func follow(_ read: ((UInt) -> UInt?)?) -> AsyncContextChain {
            let readWord = read ?? reading.readContextWord ?? readWord
            return AsyncContextChain.follow(from: context, readWord: readWord, isText: isText)
        }
        if let confirmed = confirmedWithCopy(remembered, from: context) { return confirmed }
        // The record, the context below it and the callee's return address, in
        // one read. That return address may move between call sites of the
        // same function (a loop calling one function, then another): only a
        // return into another function tells another call.
        let (first, last) = (min(calleeSlot ?? contextSlot, contextSlot), max(calleeSlot ?? returnSlot, returnSlot))
        func holds(_ live: [UInt]?) -> Bool {
            guard let live, live.count == last - first + 1,
                (contextSlot...returnSlot).allSatisfy({ live[$0 - first] == copy.words[$0] })
            else { return false }
            guard let calleeSlot else { return true }
            let (now, then) = (live[calleeSlot - first], copy.words[calleeSlot])
            return now == then || sameFunction(now, then)
        }
        func stackHolds() -> Bool { holds(liveWords(from: first, through: last)) }
        // Checked just before the chain is read and just after: a running
        // thread would have to leave the function and come back to it
        // within the read for other callers to pass. The last sample's chain
        // is confirmed with both checks in the same system call.
        var (confirmed, heldBefore, heldAfter) = (AsyncContextChain?.none, false, false)
        if let remembered, let readPairs = reading.readPairs {
            let span = (address: copy.sp + UInt(first) * UInt(MemoryLayout<UInt>.size), words: last - first + 1)
            var bracket: (before: [UInt], after: [UInt])?
            confirmed = AsyncContextChain.confirming(remembered, from: context) { addresses in
                let read = readPairs(addresses, span)
                bracket = read.map { ($0.before, $0.after) }
                return read?.pairs
            }
            if confirmed != nil, let bracket { (heldBefore, heldAfter) = (holds(bracket.before), holds(bracket.after)) }
        }
        var chain: AsyncContextChain
        if let confirmed {
            chain = confirmed
        } else {
            heldBefore = stackHolds()
            chain = follow(nil)
            heldAfter = stackHolds()
        }
        let schedulingNow = reading.schedulingNow
        var intact = heldBefore && heldAfter && (schedulingNow.map { $0() == copy.scheduling } ?? true)
        var rereads = 0
        while !intact, rereads < Self.chainRereads, let schedulingNow, let before = schedulingNow() {
            rereads += 1
            let again = follow(reading.freshContextReader?())
            intact = stackHolds() && schedulingNow() == before
            if intact { chain = again }
        }
        return intact ? chain : AsyncContextChain(resumeAddresses: [], cut: .movedOn)
    }

    /// `remembered`, when the pairs a `/proc` copy read with the stack, while
    /// the thread held still (``StackCopy/contextPairs``), confirm it from
    /// `context`: then it is the copy's chain.
    private func confirmedWithCopy(_ remembered: AsyncContextChain?, from context: UInt) -> AsyncContextChain? {
        guard let remembered, let still = copy.contextPairs, still.contexts == remembered.contexts else { return nil }
        return AsyncContextChain.confirming(remembered, from: context, readPairs: { _ in still.pairs })
    }

    /// The live stack's words at slots `first...last` of the copy, read now.
    private func liveWords(from first: Int, through last: Int) -> [UInt]? {
        let count = last - first + 1
        let address = copy.sp + UInt(first) * UInt(MemoryLayout<UInt>.size)
        let live = liveWords?(address, count) ?? Self.readLive(address, count)
        return live?.count == count ? live : nil
    }

    /// `count` words from `address`, read now through the kernel.
    private static func readLive(_ address: UInt, _ count: Int) -> [UInt]? {
        var words = [UInt](repeating: 0, count: count)
        let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: address, into: $0) }
        return copied == count ? words : nil
    }
}
