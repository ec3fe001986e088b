extension StackUnwinder {
    /// The awaits above the async function the thread runs, inserted after its
    /// frame: the frames ``unwind()`` returned, with the resume addresses of
    /// its ``AsyncContextChain`` placed before the job runner's frame (marked
    /// ``RawFrame/isAwaitResume``), and the chain itself (nil when no frame runs
    /// async code). Contexts are read through `readContextWord` (by default
    /// ``readWord``); a `remembered` chain (the last sample's) is confirmed
    /// with one batch read instead (``AsyncContextChain/confirming(_:from:readPairs:)``).
    ///
    /// The async frame is the one whose record's return address lies in the
    /// runtime's job runner (``AsyncJobRunner``); its context is the word
    /// below that record. Contexts are read after the copy, while the thread
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
    /// again): if it ran since the copy, the chain is read once more (through
    /// `rereadContextWord`, which remembers nothing read before), and kept if
    /// the thread held still meanwhile and the stack's words still hold.
    func insertingAwaits(
        into frames: [RawFrame], readContextWord: ((UInt) -> UInt?)? = nil,
        remembered: AsyncContextChain? = nil, readPairs: (([UInt]) -> [UInt]?)? = nil,
        isJobRunner: (UInt) -> Bool = { AsyncJobRunner.contains(returnAddress: $0) },
        schedulingNow: (() -> String?)? = nil, rereadContextWord: ((UInt) -> UInt?)? = nil
    ) -> (frames: [RawFrame], chain: AsyncContextChain?) {
        let slots = scratch.frameSlots
        guard slots.count == frames.count else { return (frames, nil) }
        for index in frames.indices.dropFirst() {
            let returnSlot = slots[index]
            guard returnSlot >= 2, scratch.recordSlots.contains(returnSlot), isJobRunner(frames[index].address)
            else { continue }
            let contextSlot = returnSlot - 1 - Int(AsyncContextChain.contextOffsetBelowRecord) / 8
            guard contextSlot >= 0, contextSlot < copy.words.count else { return (frames, nil) }
            let context = copy.words[contextSlot]
            guard context != 0 else { return (frames, nil) }
            func follow(_ read: ((UInt) -> UInt?)?) -> AsyncContextChain {
                AsyncContextChain.follow(from: context, readWord: read ?? readContextWord ?? readWord, isText: isText)
            }
            let calleeSlot = index >= 2 && slots[index - 1] >= 0 ? slots[index - 1] : nil
            // The callee's return address may move between call sites of the
            // same function (a loop calling one function, then another): only a
            // return into another function tells another call.
            func stackHolds() -> Bool {
                stackStillHolds(from: contextSlot, through: returnSlot)
                    && calleeSlot.map { slot in
                        liveWord(at: slot).map { $0 == copy.words[slot] || sameFunction($0, copy.words[slot]) } ?? false
                    } != false
            }
            // Checked just before the chain is read and just after: a running
            // thread would have to leave the function and come back to it
            // within the read for other callers to pass.
            let heldBefore = stackHolds()
            var chain =
                remembered.flatMap { remembered in
                    readPairs.flatMap { AsyncContextChain.confirming(remembered, from: context, readPairs: $0) }
                } ?? follow(nil)
            var intact = heldBefore && stackHolds() && (schedulingNow.map { $0() == copy.scheduling } ?? true)
            if !intact, let schedulingNow, let before = schedulingNow() {
                let again = follow(rereadContextWord)
                intact = stackHolds() && schedulingNow() == before
                if intact { chain = again }
            }
            if !intact { chain = AsyncContextChain(resumeAddresses: [], cut: .movedOn) }
            let awaits = chain.resumeAddresses.map { RawFrame(address: $0, isUncertain: false, isAwaitResume: true) }
            return (Array(frames[..<index] + awaits + frames[index...]), chain)
        }
        return (frames, nil)
    }

    /// The live stack's word at `slot` of the copy, read now.
    private func liveWord(at slot: Int) -> UInt? {
        let address = copy.sp + UInt(slot) * UInt(MemoryLayout<UInt>.size)
        return (liveWords?(address, 1) ?? Self.readLive(address, 1))?.first
    }

    /// Whether the live stack still holds the copy's words in `first...last`.
    private func stackStillHolds(from first: Int, through last: Int) -> Bool {
        let count = last - first + 1
        let address = copy.sp + UInt(first) * UInt(MemoryLayout<UInt>.size)
        guard let live = liveWords?(address, count) ?? Self.readLive(address, count) else { return false }
        return live == Array(copy.words[first...last])
    }

    /// `count` words from `address`, read now through the kernel.
    private static func readLive(_ address: UInt, _ count: Int) -> [UInt]? {
        var words = [UInt](repeating: 0, count: count)
        let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: address, into: $0) }
        return copied == count ? words : nil
    }
}
