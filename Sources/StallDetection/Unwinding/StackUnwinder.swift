/// Turns a ``StackCopy`` into the call chain, innermost first, without touching the
/// sampled thread:
///
/// 1. the frame-pointer chain: from the frame-pointer register (a signal sample)
///    when its record validates for several links, or, for a thread read from
///    `/proc` (no registers but `sp` and `pc`), from the lowest frame record whose
///    chain validates;
/// 2. above and between its records, the return addresses whose call instruction
///    provably targets the function the frame inside it runs (a direct call, or a
///    call through a GOT or PLT slot, resolved): frames of functions without a
///    frame record (libc's, an interrupted leaf such as `memset`);
/// 3. beyond the end of the certain chain only, a scan for words that look like
///    return addresses, marked uncertain.
///
/// Nothing here reads code or stack but through the copy and `readWord` (the
/// kernel), so an unmapped or execute-only page cannot fault the process; no
/// DWARF unwinder runs (glibc's `backtrace()` in the signal handler faulted on
/// execute-only JIT code).
///
/// Each frame is placed by the stack slot that holds its return address, so the
/// list is in call order whatever found it; recursion keeps every frame.
///
/// A signal handler's frames end at the kernel's signal frame: the unwind goes
/// on from the interrupted code's saved registers (see
/// `StackUnwinder+SignalFrames.swift`), and nothing in the signal frame itself
/// becomes a frame.
struct StackUnwinder {
    let copy: StackCopy
    let isText: (UInt) -> Bool
    /// Reads one word of this process' memory without faulting (for GOT slots).
    let readWord: (UInt) -> UInt?
    /// Decodes the call before a return address (tests inject one for synthetic
    /// stacks); by default ``CallSite/target(ofCallBefore:readWord:)``.
    var callTarget: ((UInt) -> CallSite.Target)?
    /// Where a function must start for a call from `candidate` to have led to
    /// `inner`, when that can be known exactly: `(candidate, inner, inner is a
    /// return address) -> start`. Within the main executable (whose symbol table is
    /// complete) a caller must call exactly the function `inner` lies in; elsewhere
    /// (libraries with only dynamic symbols, tail calls) the looser ``leads(to:from:)``
    /// applies.
    var exactStart: ((UInt, UInt, Bool) -> UInt?)?
    /// Where the code at a function's start jumps (tests inject one); by default
    /// ``CallSite/tailJumps(from:readWord:)``.
    var tailJumps: ((UInt) -> CallSite.TailJumps)?
    /// Copies the stack from an address upward (tests inject one); by default
    /// ``copyStack(from:)``: for the interrupted code of a handler that runs on
    /// an alternate signal stack.
    var copyStack: ((UInt) -> (words: [UInt], truncated: Bool))?
    /// Reads words of the live stack again (tests inject one); by default
    /// through the kernel (``insertingAwaits(into:isJobRunner:)``).
    var liveWords: ((UInt, Int) -> [UInt]?)?
    /// How many signal frames were followed to reach this copy.
    let signalDepth: Int
    /// What the code at an address decodes to, from earlier unwinds when the
    /// sampler keeps one (code does not change while it is mapped), or this
    /// unwind's own.
    let codeCache: CodeCache
    /// Whether this unwind followed the chain beyond the copy.
    let scratch = Scratch()

    init(
        copy: StackCopy, isText: @escaping (UInt) -> Bool, readWord: @escaping (UInt) -> UInt?,
        callTarget: ((UInt) -> CallSite.Target)? = nil, exactStart: ((UInt, UInt, Bool) -> UInt?)? = nil,
        tailJumps: ((UInt) -> CallSite.TailJumps)? = nil, codeCache: CodeCache = CodeCache(),
        copyStack: ((UInt) -> (words: [UInt], truncated: Bool))? = nil, signalDepth: Int = 0
    ) {
        self.copy = copy
        self.isText = isText
        self.readWord = readWord
        self.callTarget = callTarget
        self.exactStart = exactStart
        self.tailJumps = tailJumps
        self.codeCache = codeCache
        self.copyStack = copyStack
        self.signalDepth = signalDepth
    }

    /// Decoded code: the call before a return address, and a wrapper's tail
    /// jumps by its start. Owned by one thread at a time (one unwinder, or the
    /// sampling context on the detector's thread). Each table is emptied when it
    /// reaches ``limit`` entries.
    ///
    /// Kept across unwinds, a decoding stays right while its code stays mapped.
    /// One that went through a PLT stub or GOT slot keeps the destination read
    /// the first time: the call or jump had run through it (its frame is on a
    /// stack), so a lazily bound slot was bound by then. The owner empties it when
    /// the process' images change (a `dlclose` could put other code at the same
    /// address).
    final class CodeCache {
        static let limit = 16_384
        private(set) var jumps: [UInt: CallSite.TailJumps] = [:]
        private(set) var calls: [UInt: CallSite.Target] = [:]
        private(set) var signalReturns: [UInt: Bool] = [:]
        /// By interrupted address: where the return address lies, -1 for nowhere known.
        private(set) var returnSlots: [UInt: Int8] = [:]
        /// By address in a library: where the sized symbol holding it starts,
        /// 0 for none.
        private(set) var libraryStarts: [UInt: UInt] = [:]

        /// Where the return address of a function interrupted at `pc` lies:
        /// `.some(nil)` when the instruction there shows nothing, nil when not decoded yet.
        func returnSlot(at pc: UInt) -> Int?? {
            guard let known = returnSlots[pc] else { return nil }
            return .some(known < 0 ? nil : Int(known))
        }

        func remember(returnSlot: Int?, at pc: UInt) {
            if returnSlots.count >= Self.limit { returnSlots.removeAll(keepingCapacity: true) }
            returnSlots[pc] = Int8(returnSlot ?? -1)
        }

        /// Where the library function holding `address` starts: `.some(nil)`
        /// when no sized symbol holds it, nil when not looked up yet.
        func libraryStart(at address: UInt) -> UInt?? {
            guard let known = libraryStarts[address] else { return nil }
            return .some(known == 0 ? nil : known)
        }

        func remember(libraryStart: UInt?, at address: UInt) {
            if libraryStarts.count >= Self.limit { libraryStarts.removeAll(keepingCapacity: true) }
            libraryStarts[address] = libraryStart ?? 0
        }

        func isSignalReturn(_ address: UInt) -> Bool? { signalReturns[address] }

        func remember(signalReturn: Bool, at address: UInt) {
            if signalReturns.count >= Self.limit { signalReturns.removeAll(keepingCapacity: true) }
            signalReturns[address] = signalReturn
        }

        func jumps(from function: UInt) -> CallSite.TailJumps? { jumps[function] }

        func remember(_ found: CallSite.TailJumps, from function: UInt) {
            if jumps.count >= Self.limit { jumps.removeAll(keepingCapacity: true) }
            jumps[function] = found
        }

        func call(before address: UInt) -> CallSite.Target? { calls[address] }

        func remember(_ target: CallSite.Target, before address: UInt) {
            if calls.count >= Self.limit { calls.removeAll(keepingCapacity: true) }
            calls[address] = target
        }

        func removeAll() {
            jumps.removeAll()
            calls.removeAll()
            signalReturns.removeAll()
            returnSlots.removeAll()
            libraryStarts.removeAll()
        }
    }

    /// What one unwind had to read beyond the copy.
    final class Scratch {
        var wentBeyondCopy = false
        var signalContextUnread = false
        /// The slot of the signal frame's trampoline address that ended the
        /// handler's frames, and the interrupted registers.
        var signalFrame: (slot: Int, context: SignalContext)?
        /// The installed signal handlers, read once an unwind needs them.
        var signalHandlers: [UInt]?
        /// The copy's slots of return addresses read from frame records.
        var recordSlots: Set<Int> = []
        /// The slot of each frame ``unwind()`` returned (-1 for the interrupted
        /// instruction); empty when the frames came through a signal frame.
        var frameSlots: [Int] = []
    }

    /// Whether the last ``unwind()`` followed the frame chain beyond the copy
    /// (reading its records from memory): a whole copy could show more (the
    /// callers of frameless functions out there).
    var wentBeyondCopy: Bool { scratch.wentBeyondCopy }

    /// Whether the last ``unwind()`` met a signal frame whose interrupted stack
    /// could not be copied: the chain ends there, before the thread's root.
    var signalContextUnread: Bool { scratch.signalContextUnread }

    private func jumps(from function: UInt) -> CallSite.TailJumps {
        if let known = codeCache.jumps(from: function) { return known }
        let found = tailJumps?(function) ?? CallSite.tailJumps(from: function, readWord: readWord)
        codeCache.remember(found, from: function)
        return found
    }

    /// How a call to `target` can have led to `inner`'s function through the tail
    /// jumps of a wrapper or thunk (`func f() { usleep(…) }` compiles to `jmp
    /// usleep`, `NSLock.lock()` to `jmp pthread_mutex_lock`), two levels deep:
    /// `.proven` when a direct or PLT/GOT jump leads there, `.possible` when the
    /// wrapper jumps through a register (a method dispatch thunk), `.no` otherwise.
    private func tailReach(from target: UInt, to inner: UInt, exact: UInt?, depth: Int = 2) -> TailReach {
        guard depth > 0 else { return .no }
        let found = jumps(from: target)
        var result = found.indirect ? TailReach.possible : .no
        for next in found.targets where next != target {
            if let exact {
                if next == exact { return .proven }
            } else if Self.leads(to: inner, from: next) {
                return .proven
            }
            if tailReach(from: next, to: inner, exact: exact, depth: depth - 1) == .proven { return .proven }
        }
        if result == .no, depth == 2 {
            for next in found.targets where next != target && jumps(from: next).indirect { result = .possible }
        }
        return result
    }

    enum TailReach { case proven, possible, no }

    /// Whether a call from `candidate` to `target` leads to `inner`: directly, or
    /// through a wrapper's proven tail jump.
    private func call(from candidate: UInt, to target: UInt, reaches inner: UInt) -> Bool {
        let exact = exactStart?(candidate, inner, inner != copy.pc)
        if let exact, target == exact { return true }
        if exact == nil && Self.leads(to: inner, from: target) { return true }
        return tailReach(from: target, to: inner, exact: exact) == .proven
    }

    /// Whether the call before `candidate` goes through the PLT stub that holds
    /// `inner`, the interrupted code: a thread caught in a stub (16 bytes of
    /// jump, no frame record) on its way to a library function was called from
    /// there. Only the word at the stack pointer can be that return address (a
    /// stub pushes nothing), so only it is decoded again.
    private func callsStub(before candidate: UInt, holding inner: UInt) -> Bool {
        guard inner == copy.pc, let stub = CallSite.pltStub(ofCallBefore: candidate, readWord: readWord) else {
            return false
        }
        return inner >= stub && inner - stub < CallSite.pltStubSize
    }

    /// Whether a call from `candidate` to `target` may lead to `inner` through a
    /// wrapper's jump that cannot be resolved (through a register).
    private func call(from candidate: UInt, to target: UInt, mayReach inner: UInt) -> Bool {
        tailReach(from: target, to: inner, exact: exactStart?(candidate, inner, inner != copy.pc)) == .possible
    }

    /// The call before `address` (text): injected, remembered, or decoded from
    /// its bytes read through `readWord`. `isText` alone does not make them
    /// readable: the image map is taken once per process, and a mapping that was
    /// executable then may be gone now (the bytes before a "return address" at
    /// the start of a page no longer mapped would fault if read directly).
    /// Unreadable bytes are not remembered: the page may be mapped by the next
    /// unwind.
    private func target(ofCallBefore address: UInt) -> CallSite.Target {
        if let callTarget { return callTarget(address) }
        if let known = codeCache.call(before: address) { return known }
        guard address > 8, readWord(address - 8) != nil else { return .none }
        let found = CallSite.target(ofCallBefore: address, readWord: readWord)
        codeCache.remember(found, before: address)
        return found
    }

    /// Between two records of the chain: when the outer record's call does not
    /// lead to `inner`'s function, a function without a frame record of its own
    /// (a frameless Swift function in a library, such as
    /// `DispatchSemaphore.wait(wallTimeout:)`) lies between, and its caller's
    /// return address is one of the words in between: each word whose call
    /// provably leads to the current inner frame becomes a frame, innermost first.
    private func fillFramelessGap(
        from first: Int, to end: Int, before outer: UInt, inner: inout UInt, into bySlot: inout [Int: RawFrame]
    ) {
        guard first < end else { return }
        // The outer call is proven to lead to the inner frame, or cannot be
        // checked (through a register): a gap is then only filled by a word whose
        // own call provably leads to the inner frame.
        let outerTarget = target(ofCallBefore: outer)
        func outerReaches(_ inner: UInt) -> Bool {
            guard case .known(let outerTarget) = outerTarget else { return false }
            return call(from: outer, to: outerTarget, reaches: inner)
        }
        // A call of a function that starts after `inner` reaches it only as a
        // wrapper that tail-calls it; when no such jump is proven (a library's
        // functions, a few bytes apart), a word in the gap whose call targets
        // the function `inner` lies in, starting before it, is the nearer proof.
        var onlyNearby = false
        if outerReaches(inner) {
            guard case .known(let outerTarget) = outerTarget, outerTarget > inner,
                exactStart?(outer, inner, inner != copy.pc) == nil,
                tailReach(from: outerTarget, to: inner, exact: nil) != .proven
            else { return }
            onlyNearby = true
        }
        for index in first..<end where bySlot[index] == nil {
            let candidate = copy.words[index]
            guard isReturnAddress(candidate), case .known(let target) = target(ofCallBefore: candidate),
                !onlyNearby || target <= inner,
                call(from: candidate, to: target, reaches: inner)
                    || (index == 0 && callsStub(before: candidate, holding: inner))
            else { continue }
            bySlot[index] = RawFrame(address: candidate, isUncertain: false)
            inner = candidate
            if outerReaches(inner) { return }
        }
    }

    /// How many words of frame records beyond the copy may be read from memory
    /// (two a frame: 8,192 frames).
    static let readsBeyondCopy = 16_384

    /// The most uncertain frames added beyond the certain chain, from at most
    /// `uncertainScanWords` words beyond it.
    static let uncertainLimit = 24
    private static let uncertainScanWords = 4_096
    /// How far up the copy the scan for the next frame record goes (256 KB).
    private static let anchorScanWords = 32_768
    /// The farthest a frame record's saved frame pointer may lie above the record
    /// (1 MB): farther, the word is data, not a link.
    private static let recordLinkLimit: UInt = 0x10_0000
    /// Two addresses this close (1 MB) are taken to be in one library, where a
    /// tail call may lie between a call and the function it reached.
    private static let sameLibraryDistance: UInt = 0x10_0000
    /// A callee starts at most this far (256 KB) before the code it led to.
    private static let calleeReach: UInt = 0x4_0000
    /// A wrapper that tail-calls its target lies at most this far (4 KB) after it.
    private static let wrapperReach: UInt = 0x1000
    private static let wordSize = UInt(MemoryLayout<UInt>.size)

    func word(at address: UInt) -> UInt? {
        guard address >= copy.sp, address % Self.wordSize == 0 else { return nil }
        let index = Int((address - copy.sp) / Self.wordSize)
        return index < copy.words.count ? copy.words[index] : nil
    }

    private func slot(of address: UInt) -> Int { Int((address - copy.sp) / Self.wordSize) }

    /// Text right after a call instruction (decoded only: no memory is read).
    private func isReturnAddress(_ value: UInt) -> Bool {
        guard isText(value) else { return false }
        if case .none = target(ofCallBefore: value) { return false }
        return true
    }

    /// What an unwind has found so far: the frames by the copy's word index they
    /// were found at, the innermost frame found, and how many more frame
    /// records beyond the copy may still be read.
    private struct Walk {
        var bySlot: [Int: RawFrame] = [:]
        var inner: UInt
        var readsBeyond = StackUnwinder.readsBeyondCopy
    }

    func unwind() -> [RawFrame] {
        scratch.signalFrame = nil
        scratch.recordSlots = []
        scratch.frameSlots = []
        var walk = Walk(inner: copy.pc)
        placeInterruptedCaller(&walk)
        // 1 and 2, segment by segment: a frame-pointer chain, and above its
        // records the validated return addresses; where a chain breaks off (a
        // function without frame pointer, such as libc's qsort calling back into
        // Swift), the next segment starts at the next record that validates.
        var (anchor, gapAboveFirstRecord) = firstAnchor(&walk)
        var scanFrom = 0
        while let framePointer = anchor {
            let (lastSlot, complete) = followChain(
                from: framePointer, scanFrom: scanFrom, gapAboveFirstRecord: &gapAboveFirstRecord, &walk)
            if complete || scratch.signalFrame != nil || lastSlot + 1 >= copy.words.count { break }
            scanFrom = lastSlot + 1
            anchor = scanToAnchor(from: scanFrom, inner: &walk.inner, into: &walk.bySlot)
        }
        if let (signalSlot, context) = scratch.signalFrame {
            return framesThroughSignalFrame(at: signalSlot, context: context, handlerFrames: walk.bySlot)
        }
        addUncertainFrames(beyondChainIn: &walk.bySlot)
        var frames = [RawFrame(address: copy.pc, isUncertain: false)]
        scratch.frameSlots = [-1]
        for slot in walk.bySlot.keys.sorted() {
            frames.append(walk.bySlot[slot]!)
            scratch.frameSlots.append(slot)
        }
        return frames
    }

    /// 0. A function interrupted at its entry or at its `ret` has no frame
    /// record: its return address lies at a slot its instruction tells
    /// (``CallSite/returnAddressSlot(interruptedAt:readWord:)``), and is its
    /// caller's frame even when the call cannot be proven (through a register:
    /// a value witness such as `__swift_noop_void_return`, a closure). Without
    /// it the frame-pointer register, still the caller's, would skip the caller.
    private func placeInterruptedCaller(_ walk: inout Walk) {
        let slot: Int?
        if let known = codeCache.returnSlot(at: copy.pc) {
            slot = known
        } else {
            slot = CallSite.returnAddressSlot(interruptedAt: copy.pc, readWord: readWord)
            codeCache.remember(returnSlot: slot, at: copy.pc)
        }
        guard let slot, slot < copy.words.count, isReturnAddress(copy.words[slot]) else { return }
        walk.bySlot[slot] = RawFrame(address: copy.words[slot], isUncertain: false)
        walk.inner = copy.words[slot]
    }

    /// The frame record the first chain starts from, and whether frames may lie
    /// between the stack pointer and it.
    private func firstAnchor(_ walk: inout Walk) -> (anchor: UInt?, gapAboveFirstRecord: Bool) {
        // The register is only a frame pointer in code built with one: libc may use
        // it for data (even a pointer into the stack).
        var anchor: UInt? = copy.fp.flatMap { validates($0, links: 3) ? $0 : nil }
        // The interrupted function may have no frame record (a leaf such as
        // glibc's `memset`, or one interrupted in its prologue): the frame
        // pointer then names its caller's record, and the caller's return address
        // lies between the stack pointer and that record — filled below like any
        // other frameless gap.
        // A frameless handler leaves the interrupted code's frame pointer in the
        // register: its record lies above the signal frame, which the scan finds.
        if let record = anchor, signalFrameBelow(record) { anchor = nil }
        guard anchor == nil else { return (anchor, true) }
        return (scanToAnchor(from: 0, inner: &walk.inner, into: &walk.bySlot), false)
    }

    /// A word of a frame record: from the copy, or beyond it (a stack deeper
    /// than the copy) read from memory while the walk's budget lasts, so that
    /// the outer frames and the thread's root stay in the report.
    private func chainWord(at address: UInt, _ walk: inout Walk) -> UInt? {
        if let value = word(at: address) { return value }
        guard address >= copy.sp + UInt(copy.words.count) * Self.wordSize, walk.readsBeyond > 0 else { return nil }
        walk.readsBeyond -= 1
        scratch.wentBeyondCopy = true
        return readWord(address)
    }

    /// Follows one frame-pointer chain from `framePointer`, filling the frameless
    /// gaps between its records; returns the slot of the last return address it
    /// took and whether the chain reached its root. Stops at a signal handler's
    /// record (``Scratch/signalFrame``) and where a link does not hold. Frames
    /// may lie below the chain's first record only when `gapAboveFirstRecord`
    /// (cleared once a record is taken).
    private func followChain(
        from framePointer: UInt, scanFrom: Int, gapAboveFirstRecord: inout Bool, _ walk: inout Walk
    ) -> (lastSlot: Int, complete: Bool) {
        var framePointer = framePointer
        var lastSlot = scanFrom
        var firstRecord = true
        while let saved = chainWord(at: framePointer, &walk),
            let returnAddress = chainWord(at: framePointer + Self.wordSize, &walk),
            returnAddress != 0, isText(returnAddress)
        {
            let returnSlot = slot(of: framePointer) + 1
            let gapStart = firstRecord ? 0 : lastSlot + 1
            if returnSlot < copy.words.count, let context = signalContext(atSlot: returnSlot) {
                // A signal handler's record: the frames between end here.
                fillFramelessGap(
                    from: gapStart, to: returnSlot - 1, before: returnAddress, inner: &walk.inner, into: &walk.bySlot)
                scratch.signalFrame = (returnSlot, context)
                return (lastSlot, false)
            }
            if (!firstRecord || gapAboveFirstRecord) && returnSlot - 1 <= copy.words.count {
                fillFramelessGap(
                    from: gapStart, to: returnSlot - 1, before: returnAddress, inner: &walk.inner, into: &walk.bySlot)
            }
            gapAboveFirstRecord = false
            firstRecord = false
            if walk.bySlot[returnSlot] == nil {
                walk.bySlot[returnSlot] = RawFrame(address: returnAddress, isUncertain: false)
            }
            scratch.recordSlots.insert(returnSlot)
            walk.inner = returnAddress
            lastSlot = returnSlot
            if saved == 0 { return (lastSlot, true) }
            guard saved > framePointer, saved - framePointer < Self.recordLinkLimit, chainWord(at: saved, &walk) != nil
            else { break }
            framePointer = saved
        }
        return (lastSlot, false)
    }

    /// 3. Beyond the certain chain: uncertain candidates, where it broke off.
    private func addUncertainFrames(beyondChainIn bySlot: inout [Int: RawFrame]) {
        let words = copy.words
        var added = 0
        var index = (bySlot.keys.max() ?? -1) + 1
        let scanEnd = min(words.count, index + Self.uncertainScanWords)
        while index < scanEnd && added < Self.uncertainLimit {
            if isReturnAddress(words[index]) {
                bySlot[index] = RawFrame(address: words[index], isUncertain: true)
                added += 1
            }
            index += 1
        }
    }

    /// What a scan for the next frame record has found: the slots it added
    /// frames at (innermost first), the innermost frame proven by its call, and
    /// how many frames had been added then. Uncertain words found after it (an
    /// indirect call's return address, a tail call's) may be real (a C library
    /// calling back) or stale leftovers in a frame's locals.
    private struct AnchorScan {
        var added: [Int] = []
        var certainInner: UInt
        var certainCount = 0
    }

    /// Walks up from slot `first` to the next frame record the chain can continue
    /// from, and returns it. A record qualifies when its chain holds for three
    /// links (or runs to its end, or out of the copy, after two) and it belongs to
    /// the function running at `inner`: its return address follows a call of that
    /// function. (Below a sleeping thread's live frames lie stale records of calls
    /// that returned long ago, whose chains are valid too.)
    ///
    /// On the way, each word whose call provably leads to
    /// `inner`'s function becomes a frame and the new `inner`: a direct (or GOT,
    /// or PLT) call of a function that starts at most 256 KB before `inner`, or of
    /// a wrapper at most 4 KB after it that tail-calls it. An indirect call through
    /// a register cannot be checked: its frame is kept, marked uncertain, since it
    /// sits where the certain chain has a gap.
    private func scanToAnchor(from first: Int, inner: inout UInt, into bySlot: inout [Int: RawFrame]) -> UInt? {
        let words = copy.words
        guard first < words.count else { return nil }
        let limit = min(words.count, first + Self.anchorScanWords)
        let entryInner = inner
        var scan = AnchorScan(certainInner: inner)
        var firstValid: Int?
        for index in first..<limit {
            let record = copy.sp + UInt(index) * Self.wordSize
            if let context = signalContext(atSlot: index), runsSignalHandler(inner) {
                // The handler's frames end at the signal frame (found by the scan:
                // only where the frame below it runs an installed handler, not in
                // a stale signal frame left in a live frame's locals).
                scratch.signalFrame = (index, context)
                return nil
            }
            if index + 1 < words.count, isReturnAddress(words[index + 1]), validates(record, links: 3) {
                if firstValid == nil { firstValid = index }
                if continuesFrames(atRecord: index, scan, inner: &inner, into: &bySlot) { return record }
            }
            guard bySlot[index] == nil else { continue }
            addCandidate(at: index, &scan, inner: &inner, into: &bySlot)
        }
        // No record continues from the frames found: take the first record whose
        // chain holds, and drop what the scan found above it.
        guard let firstValid else { return nil }
        for index in scan.added where index > firstValid { bySlot[index] = nil }
        inner = scan.added.last(where: { $0 <= firstValid }).flatMap { bySlot[$0]?.address } ?? entryInner
        return copy.sp + UInt(firstValid) * Self.wordSize
    }

    /// Whether the validated record at slot `index` continues the frames the scan
    /// found (the chain then goes on from it). When its call proves a frame the
    /// scan kept uncertain, that frame becomes certain and the frames after it
    /// are dropped.
    private func continuesFrames(
        atRecord index: Int, _ scan: AnchorScan, inner: inout UInt, into bySlot: inout [Int: RawFrame]
    ) -> Bool {
        let returnAddress = copy.words[index + 1]
        guard case .known(let target) = target(ofCallBefore: returnAddress) else {
            // A call through a register (a C library calling back): accepted,
            // unless a record whose call provably reaches `inner` lies between it
            // and the record it links to — then it is a stale record left below a
            // live frame, and the scan goes on to that one.
            return !provableRecordAhead(of: index, inner: inner, certainInner: scan.certainInner)
        }
        // The record's call reaches the function of one of the frames found since
        // the last proven one (innermost last), or that one: the frame it reaches
        // is proven too (it followed an indirect call, as a class method's
        // `call *0x108(%rax)`, or a wrapper's tail call), and the uncertain words
        // after it were stale leftovers in a frame's locals.
        for position in stride(from: scan.added.count - 1, through: scan.certainCount, by: -1) {
            guard let frame = bySlot[scan.added[position]] else { continue }
            let below = position > 0 ? bySlot[scan.added[position - 1]]?.address : nil
            if let below, sameFunction(frame.address, below) { continue }
            if call(from: returnAddress, to: target, reaches: frame.address) {
                for slot in scan.added[(position + 1)...] { bySlot[slot] = nil }
                bySlot[scan.added[position]] = RawFrame(address: frame.address, isUncertain: false)
                inner = frame.address
                return true
            }
        }
        if call(from: returnAddress, to: target, reaches: scan.certainInner) {
            for slot in scan.added[scan.certainCount...] { bySlot[slot] = nil }
            inner = scan.certainInner
            return true
        }
        return false
    }

    /// Whether two return addresses lie in the same function, as far as the
    /// executable's symbol table tells (false when it cannot). An uncertain word
    /// in the function of the frame right below it is no caller of that frame but
    /// a leftover in its locals (a return address from a call that returned,
    /// above a stack pointer a dynamic allocation moved down since, as for a
    /// resilient value in a debug build); a record whose call reaches that
    /// function proves the frame below, not the leftover.
    func sameFunction(_ first: UInt, _ second: UInt) -> Bool {
        guard let exactStart, let start = exactStart(first, first, true) else { return false }
        return exactStart(second, second, true) == start
    }

    /// Keeps the word at slot `index` as a frame when it is a return address
    /// whose call may lead to `inner`: certain when the call provably reaches
    /// it, uncertain otherwise.
    private func addCandidate(
        at index: Int, _ scan: inout AnchorScan, inner: inout UInt, into bySlot: inout [Int: RawFrame]
    ) {
        let candidate = copy.words[index]
        guard isReturnAddress(candidate) else { return }
        var isUncertain = true
        switch target(ofCallBefore: candidate) {
        case .known(let target):
            if call(from: candidate, to: target, reaches: inner) {
                isUncertain = false
            } else if call(from: candidate, to: target, mayReach: inner) {
                // A wrapper that jumps on through a register (a method dispatch
                // thunk): kept, uncertain.
            } else if exactStart?(candidate, inner, inner != copy.pc) == nil,
                (target > inner ? target - inner : inner - target) < Self.sameLibraryDistance
            {
                // A call within the same library that does not reach `inner`'s
                // function directly: a tail call may lie between (glibc's futex
                // waits). Kept, uncertain.
            } else {
                return
            }
        case .unknown:
            break
        case .none:
            return
        }
        bySlot[index] = RawFrame(address: candidate, isUncertain: isUncertain)
        inner = candidate
        scan.added.append(index)
        if !isUncertain {
            scan.certainInner = candidate
            scan.certainCount = scan.added.count
        }
    }

    /// Whether a validated record whose call provably reaches `inner` (or
    /// `certainInner`) lies above the record at slot `index`, up to and including
    /// the record that one links to. If the record at `index` were live, its own
    /// call would lead to `inner`, and the record it links to would be its
    /// caller's, leading to it: a provable caller of `inner` there or between
    /// shows it is a stale record left below a live frame.
    private func provableRecordAhead(of index: Int, inner: UInt, certainInner: UInt) -> Bool {
        let words = copy.words
        let saved = words[index]
        guard saved > copy.sp + UInt(index) * Self.wordSize else { return false }
        let last = min(words.count - 2, slot(of: saved))
        guard index + 1 <= last else { return false }
        for ahead in (index + 1)...last {
            let record = copy.sp + UInt(ahead) * Self.wordSize
            guard isReturnAddress(words[ahead + 1]), validates(record, links: 3),
                case .known(let target) = target(ofCallBefore: words[ahead + 1])
            else { continue }
            if call(from: words[ahead + 1], to: target, reaches: inner)
                || call(from: words[ahead + 1], to: target, reaches: certainInner)
            {
                return true
            }
        }
        return false
    }

    /// Whether a call to `target` can have led to code at `inner`: the callee starts
    /// at most 256 KB before it, or is a wrapper at most 4 KB after it that
    /// tail-calls it.
    static func leads(to inner: UInt, from target: UInt) -> Bool {
        (target <= inner && inner - target < calleeReach) || (target > inner && target - inner < wrapperReach)
    }

    private func validates(_ record: UInt, links: Int) -> Bool {
        guard let saved = word(at: record), let returnAddress = word(at: record + Self.wordSize) else { return false }
        // A signal handler's record: the chain ends at the signal frame.
        if signalContext(atSlot: slot(of: record) + 1) != nil { return true }
        guard isReturnAddress(returnAddress) else { return false }
        if links <= 1 { return true }
        if saved == 0 { return links <= 2 }
        guard saved > record, saved - record < Self.recordLinkLimit, saved % Self.wordSize == 0 else { return false }
        if word(at: saved) == nil { return links <= 2 }  // beyond the copy
        return validates(saved, links: links - 1)
    }
}
