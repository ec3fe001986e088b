import Testing

@testable import StallDetection

/// The awaiting callers of a running async function, over synthetic stacks and
/// contexts: text is [0x1000_0000, 0x2000_0000), the job runner returns at
/// 0x1200_0010, contexts lie at 0x5000_0000 and up.
@Suite("Awaiting callers: the async context chain (synthetic stacks)")
struct AwaitingCallerTests {
    static let sp: UInt = 0x7000_0000
    static let pc: UInt = 0x1800_0040
    static let inPartial: UInt = 0x1000_0100
    static let runner: UInt = 0x1200_0010
    static let outer: UInt = 0x1000_0300

    /// The blocker's record (slot 1), the partial function's context (slot 3)
    /// below its record (slot 4, returning into the runner), the runner's
    /// record (slot 6): the stack a thread blocked in async code has.
    static func stackWords(context: UInt) -> [UInt] {
        let record = { (slot: Int) in sp + UInt(slot * 8) }
        return [0x42, record(4), inPartial, context, record(6), runner, 0, outer]
    }

    /// Contexts at 0x5000_0000 + 0x40 × i, each resuming its caller at
    /// 0x1000_0000 + 0x1000 × (i + 1), the last one the root.
    static func contexts(_ count: Int) -> [UInt: UInt] {
        var memory: [UInt: UInt] = [:]
        for index in 0..<count {
            let context: UInt = 0x5000_0000 + UInt(index) * 0x40
            memory[context] = index == count - 1 ? 0 : context + 0x40
            memory[context + 8] = 0x1000_0000 + 0x1000 * UInt(index + 1)
        }
        return memory
    }

    func unwind(
        words: [UInt], memory: [UInt: UInt]
    ) -> (frames: [RawFrame], chain: AsyncContextChain?) {
        let copy = StackCopy(pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: words, truncated: false)
        var unwinder = StackUnwinder(
            copy: copy, isText: { $0 >= 0x1000_0000 && $0 < 0x2000_0000 }, readWord: { memory[$0] },
            callTarget: { _ in .unknown }, tailJumps: { _ in CallSite.TailJumps() })
        unwinder.liveWords = { address, count in
            let first = Int((address - Self.sp) / 8)
            return Array(words[first..<(first + count)])
        }
        let (frames, chain, _) = unwinder.insertingAwaits(into: unwinder.unwind(), isJobRunner: { $0 == Self.runner })
        return (frames, chain)
    }

    @Test("each awaiting caller's resume point follows the running partial function, before the job runner, marked")
    func chainIsInserted() throws {
        let (frames, chain) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: Self.contexts(3))
        #expect(
            frames.map(\.address) == [
                Self.pc, Self.inPartial, 0x1000_1000, 0x1000_2000, 0x1000_3000, Self.runner, Self.outer,
            ])
        #expect(frames.map(\.isAwaitResume) == [false, false, true, true, true, false, false])
        #expect(frames.allSatisfy { !$0.isUncertain })
        // Resume points are named as instructions, not as return addresses.
        #expect(
            frames.enumerated().map { $0.element.isReturnAddress(at: $0.offset) } == [
                false, true, false, false, false, true, true,
            ])
        #expect(try #require(chain).cut == nil)
    }

    @Test("a context that cannot be read ends the chain there, with the reason; nothing after it is guessed")
    func unreadableContext() throws {
        var memory = Self.contexts(4)
        memory[0x5000_0080] = nil
        memory[0x5000_0088] = nil
        let (frames, chain) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: memory)
        #expect(frames.filter(\.isAwaitResume).map(\.address) == [0x1000_1000, 0x1000_2000])
        #expect(try #require(chain).cut == .unreadable(0x5000_0080))
        #expect(try #require(chain?.cut).reason.contains("0x50000080"))
    }

    @Test("a resume address that is not code, or a misaligned parent: what was read is no context, the chain stops")
    func garbageStopsTheChain() throws {
        var memory = Self.contexts(3)
        memory[0x5000_0048] = 0x3000_0000  // not text
        let (frames, chain) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: memory)
        #expect(frames.filter(\.isAwaitResume).map(\.address) == [0x1000_1000])
        #expect(try #require(chain).cut == .notCode(0x3000_0000))

        var skewed = Self.contexts(3)
        skewed[0x5000_0000] = 0x5000_0044
        let (misaligned, cut) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: skewed)
        #expect(misaligned.filter(\.isAwaitResume).map(\.address) == [0x1000_1000])
        #expect(try #require(cut).cut == .misaligned(0x5000_0044))
    }

    @Test("a thread that left the partial function before its contexts were read shows no awaiting caller")
    func threadMovedOn() throws {
        // Slot 3 holds the context: another one lies there now.
        let moved = unwinder(memory: Self.contexts(3)) { slot, words, _ in
            Self.replacing(3, with: 0x5000_0100, in: words, from: slot)
        }
        let (frames, chain, _) = moved.insertingAwaits(into: moved.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(!frames.contains { $0.isAwaitResume })
        #expect(frames.map(\.address) == [Self.pc, Self.inPartial, Self.runner, Self.outer])
        #expect(try #require(chain).cut == .movedOn)
    }

    @Test(
        "a job runner's frame record beyond the copy (read from memory by the unwind): no crash, the awaits said to be missing"
    )
    func recordBeyondTheCopy() throws {
        // Records at slots 1, 3, 5 and 8; the one at 8 returns into the job
        // runner (slot 9), its context at slot 7. The runner's return address
        // and the root are read from memory.
        let record = { (slot: Int) in Self.sp + UInt(slot * 8) }
        let words: [UInt] = [
            0x42, record(3), 0x1000_0400, record(5), 0x1000_0500, record(8), Self.inPartial, 0x5000_0000,
            record(10), Self.runner, 0, Self.outer,
        ]
        for copied in [9, 7] {
            var memory = Self.contexts(3)
            for slot in copied..<words.count { memory[record(slot)] = words[slot] }
            // The copy ends after the record's first word (slot 8), or before the
            // context (slot 7).
            let copy = StackCopy(
                pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: Array(words.prefix(copied)), truncated: true)
            var unwinder = StackUnwinder(
                copy: copy, isText: { $0 >= 0x1000_0000 && $0 < 0x2000_0000 }, readWord: { memory[$0] },
                callTarget: { _ in .unknown }, tailJumps: { _ in CallSite.TailJumps() })
            unwinder.liveWords = { address, count in
                let first = Int((address - Self.sp) / 8)
                return first + count <= words.count ? Array(words[first..<(first + count)]) : nil
            }
            let (frames, chain, cutAt) = unwinder.insertingAwaits(
                into: unwinder.unwind(), isJobRunner: { $0 == Self.runner })
            #expect(unwinder.wentBeyondCopy)
            #expect(
                frames.map(\.address) == [Self.pc, 0x1000_0400, 0x1000_0500, Self.inPartial, Self.runner, Self.outer])
            #expect(!frames.contains { $0.isAwaitResume })
            #expect(chain?.cut == .beyondCopy && cutAt == 4)
        }
    }

    @Test("a chain that loops is cut at the depth limit, said as such")
    func loopingChainIsCut() throws {
        let memory: [UInt: UInt] = [
            0x5000_0000: 0x5000_0040, 0x5000_0008: 0x1000_1000, 0x5000_0040: 0x5000_0000, 0x5000_0048: 0x1000_2000,
        ]
        let (frames, chain) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: memory)
        #expect(frames.filter(\.isAwaitResume).count == AsyncContextChain.depthLimit)
        #expect(try #require(chain).cut == .depthLimit)
    }

    @Test("a 200-await chain keeps all 200 callers, innermost first")
    func deepChain() throws {
        let (frames, chain) = unwind(words: Self.stackWords(context: 0x5000_0000), memory: Self.contexts(200))
        let awaits = frames.filter(\.isAwaitResume).map(\.address)
        #expect(awaits == (1...200).map { 0x1000_0000 + 0x1000 * UInt($0) })
        #expect(try #require(chain).cut == nil)
    }

    @Test("no frame returns into the job runner from a frame record: no context is read, nothing is added")
    func synchronousCodeIsUntouched() {
        // The runner's return address found without a record (a stale word):
        // the word below it is no context.
        var words = Self.stackWords(context: 0x5000_0000)
        words[4] = 0x99
        let (frames, chain) = unwind(words: words, memory: Self.contexts(3))
        #expect(!frames.contains { $0.isAwaitResume })
        #expect(chain == nil)
    }

    @Test("a remembered chain stands only when every context reads the same again; else it is followed afresh")
    func rememberedChain() throws {
        let isText = { (address: UInt) in address >= 0x1000_0000 && address < 0x2000_0000 }
        let memory = Self.contexts(3)
        let first = AsyncContextChain.follow(from: 0x5000_0000, readWord: { memory[$0] }, isText: isText)
        #expect(first.contexts == [0x5000_0000, 0x5000_0040, 0x5000_0080])
        func reader(_ memory: [UInt: UInt]) -> ([UInt]) -> [UInt]? {
            { addresses in
                var words: [UInt] = []
                for address in addresses {
                    guard let parent = memory[address], let resume = memory[address + 8] else { return nil }
                    words += [parent, resume]
                }
                return words
            }
        }
        #expect(AsyncContextChain.confirming(first, from: 0x5000_0000, readPairs: reader(memory)) == first)
        var resumedElsewhere = memory
        resumedElsewhere[0x5000_0088] = 0x1000_9000
        #expect(AsyncContextChain.confirming(first, from: 0x5000_0000, readPairs: reader(resumedElsewhere)) == nil)
        var relinked = memory
        relinked[0x5000_0040] = 0x5000_00C0
        #expect(AsyncContextChain.confirming(first, from: 0x5000_0000, readPairs: reader(relinked)) == nil)
        #expect(AsyncContextChain.confirming(first, from: 0x5000_0040, readPairs: reader(memory)) == nil)
        // Through the unwinder: a changed chain is read afresh, not remembered.
        let words = Self.stackWords(context: 0x5000_0000)
        let copy = StackCopy(pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: words, truncated: false)
        var unwinder = StackUnwinder(
            copy: copy, isText: isText, readWord: { resumedElsewhere[$0] }, callTarget: { _ in .unknown },
            tailJumps: { _ in CallSite.TailJumps() })
        unwinder.liveWords = { address, count in
            let slot = Int((address - Self.sp) / 8)
            return Array(words[slot..<(slot + count)])
        }
        let (_, chain, _) = unwinder.insertingAwaits(
            into: unwinder.unwind(), remembered: first,
            readPairs: { addresses, _ in reader(resumedElsewhere)(addresses).map { ($0, [], []) } },
            isJobRunner: { $0 == Self.runner })
        #expect(try #require(chain).resumeAddresses == [0x1000_1000, 0x1000_2000, 0x1000_9000])
    }

    @Test("a remembered chain confirmed between two readings of the stack in one call: it stands when both hold")
    func rememberedChainBracketed() throws {
        let isText = { (address: UInt) in address >= 0x1000_0000 && address < 0x2000_0000 }
        let memory = Self.contexts(3)
        let remembered = AsyncContextChain.follow(from: 0x5000_0000, readWord: { memory[$0] }, isText: isText)
        let words = Self.stackWords(context: 0x5000_0000)
        // The span read around the pairs: from the callee's return address
        // (slot 2) through the runner's (slot 5).
        func chain(before: @escaping (Int) -> UInt?, after: @escaping (Int) -> UInt?) throws -> AsyncContextChain {
            let unwinder = unwinder(memory: [:]) { _, words, _ in words }
            var spans: [(UInt, Int)] = []
            let reader: StackUnwinder.PairReader = { addresses, span in
                spans.append(span)
                let pairs = addresses.flatMap { [memory[$0] ?? 0, memory[$0 + 8] ?? 0] }
                let slots = (2..<(2 + span.words))
                return (pairs, slots.map { before($0) ?? words[$0] }, slots.map { after($0) ?? words[$0] })
            }
            let (_, chain, _) = unwinder.insertingAwaits(
                into: unwinder.unwind(), remembered: remembered, readPairs: reader, isJobRunner: { $0 == Self.runner })
            #expect(spans.count == 1 && spans.first?.0 == Self.sp + 16 && spans.first?.1 == 4)
            return try #require(chain)
        }
        #expect(try chain(before: { _ in nil }, after: { _ in nil }) == remembered)
        // The context slot changed before the pairs were read, or the callee's
        // return address after (a return into another function).
        #expect(try chain(before: { $0 == 3 ? 0x5000_0100 : nil }, after: { _ in nil }).cut == .movedOn)
        #expect(try chain(before: { _ in nil }, after: { $0 == 2 ? 0x1000_0500 : nil }).cut == .movedOn)
    }

    @Test(
        "a remembered chain whose pairs a /proc copy read while the thread held still: confirmed with nothing read again"
    )
    func rememberedChainReadWithTheCopy() throws {
        let isText = { (address: UInt) in address >= 0x1000_0000 && address < 0x2000_0000 }
        let memory = Self.contexts(3)
        let remembered = AsyncContextChain.follow(from: 0x5000_0000, readWord: { memory[$0] }, isText: isText)
        let pairs = remembered.contexts.flatMap { [memory[$0] ?? 0, memory[$0 + 8] ?? 0] }
        func chain(pairs: [UInt]) throws -> (AsyncContextChain, reads: Int) {
            var copy = StackCopy(
                pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: Self.stackWords(context: 0x5000_0000),
                truncated: false, scheduling: "slept")
            copy.contextPairs = (remembered.contexts, pairs)
            let reads = Locked(0)
            var unwinder = StackUnwinder(
                copy: copy, isText: isText, readWord: { memory[$0] }, callTarget: { _ in .unknown },
                tailJumps: { _ in CallSite.TailJumps() })
            unwinder.liveWords = { address, count in
                reads.withLock { $0 += 1 }
                let slot = Int((address - Self.sp) / 8)
                return Array(Self.stackWords(context: 0x5000_0000)[slot..<(slot + count)])
            }
            let (_, chain, _) = unwinder.insertingAwaits(
                into: unwinder.unwind(), remembered: remembered,
                readPairs: { addresses, _ in
                    reads.withLock { $0 += 1 }
                    return nil
                }, isJobRunner: { $0 == Self.runner }, schedulingNow: { "ran since" })
            return (try #require(chain), reads.withLock { $0 })
        }
        let (kept, reads) = try chain(pairs: pairs)
        #expect(kept == remembered && reads == 0)
        // Pairs that do not confirm it (a context resumed elsewhere when the copy
        // was read): the chain is read afresh, from memory, which holds the
        // remembered one again.
        var changed = pairs
        changed[3] = 0x1000_9000
        let (afresh, readsAgain) = try chain(pairs: changed)
        #expect(afresh.resumeAddresses == remembered.resumeAddresses && afresh.cut == nil)
        #expect(readsAgain > 0)
    }

    /// `words`, read from `slot` on, with the word of slot `target` (when among
    /// them) replaced by `value`.
    static func replacing(_ target: Int, with value: UInt, in words: [UInt], from slot: Int) -> [UInt] {
        var words = words
        if target >= slot, target < slot + words.count { words[target - slot] = value }
        return words
    }

    /// The unwinder over ``stackWords(context:)`` with contexts in `memory`, the
    /// copy's scheduling counts `scheduling`, and live words from `live` (called
    /// with the slot, the copy's words there, and whether a context was read yet).
    func unwinder(
        memory: [UInt: UInt], scheduling: String? = nil, exactStart: ((UInt) -> UInt?)? = nil,
        live: @escaping (Int, [UInt], Bool) -> [UInt]
    ) -> StackUnwinder {
        let words = Self.stackWords(context: 0x5000_0000)
        let copy = StackCopy(
            pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: words, truncated: false, scheduling: scheduling)
        let contextRead = Locked(false)
        var unwinder = StackUnwinder(
            copy: copy, isText: { $0 >= 0x1000_0000 && $0 < 0x2000_0000 },
            readWord: { address in
                if address >= 0x5000_0000 { contextRead.withLock { $0 = true } }
                return memory[address]
            },
            callTarget: { _ in .unknown }, exactStart: exactStart.map { start in { _, inner, _ in start(inner) } },
            tailJumps: { _ in CallSite.TailJumps() })
        unwinder.liveWords = { address, count in
            let slot = Int((address - Self.sp) / 8)
            return live(slot, Array(words[slot..<(slot + count)]), contextRead.withLock { $0 })
        }
        return unwinder
    }

    @Test(
        "a thread that left the async function for another just as deep (the same record, the same context address) shows no awaiting caller"
    )
    func anotherFunctionAtTheSameAddresses() throws {
        // Slot 2 holds the return address into the partial function: the thread
        // returned from it and runs another function whose context the task put at
        // the same address, so the record and the context slot read the same.
        let moved = unwinder(memory: Self.contexts(3)) { slot, words, _ in
            Self.replacing(2, with: 0x1000_0500, in: words, from: slot)
        }
        let (frames, chain, _) = moved.insertingAwaits(into: moved.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(chain?.cut == .movedOn)
        #expect(!frames.contains { $0.isAwaitResume })
        // It left and came back between the check before the read and the one
        // after: the contexts read may be the other call's.
        let returned = unwinder(memory: Self.contexts(3)) { slot, words, contextRead in
            contextRead ? words : Self.replacing(2, with: 0x1000_0500, in: words, from: slot)
        }
        let (_, again, _) = returned.insertingAwaits(into: returned.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(again?.cut == .movedOn)
        // Another call site of the same async function (a loop calling one
        // function, then another): the same call, its callers stand.
        let partialStart = { (address: UInt) -> UInt? in
            address > 0x1000_00F0 && address < 0x1000_0200 ? 0x1000_00F0 : nil
        }
        let sameCall = unwinder(memory: Self.contexts(3), exactStart: partialStart) { slot, words, _ in
            Self.replacing(2, with: 0x1000_0180, in: words, from: slot)
        }
        let (_, kept, _) = sameCall.insertingAwaits(into: sameCall.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(try #require(kept).resumeAddresses == [0x1000_1000, 0x1000_2000, 0x1000_3000])
    }

    @Test(
        "a thread read asleep that ran since: its chain is read again while it holds still, or not shown when it does not"
    )
    func sleeperThatRanIsReadAgain() throws {
        // The copy's contexts (read first) are another call's; the thread holds
        // still from the second reading of its counts on, and its contexts then
        // are the three of `contexts(3)`.
        var stale = Self.contexts(3)
        stale[0x5000_0048] = 0x1000_9000
        let fresh = Self.contexts(3)
        let expected: [UInt] = [0x1000_1000, 0x1000_2000, 0x1000_3000]
        var counts = ["ran", "ran", "ran"]
        var readers = 0
        let reader = { () -> (UInt) -> UInt? in
            readers += 1
            return { fresh[$0] }
        }
        let ran = unwinder(memory: stale, scheduling: "slept") { _, words, _ in words }
        let (_, chain, _) = ran.insertingAwaits(
            into: ran.unwind(), isJobRunner: { $0 == Self.runner }, schedulingNow: { counts.removeFirst() },
            freshContextReader: reader)
        #expect(try #require(chain).resumeAddresses == expected)
        #expect(chain?.cut == nil)
        #expect(readers == 1)
        // It ran through the first reading again (a short sleep's wake-up), then
        // held still: the second, with a reader of its own, stands.
        var wokeOnce = ["ran", "ran", "woke", "woke", "woke"]
        readers = 0
        let (_, second, _) = ran.insertingAwaits(
            into: ran.unwind(), isJobRunner: { $0 == Self.runner }, schedulingNow: { wokeOnce.removeFirst() },
            freshContextReader: reader)
        #expect(try #require(second).resumeAddresses == expected)
        #expect(readers == 2 && wokeOnce.isEmpty)
        // It keeps running: nothing is shown, after a bounded number of tries.
        var runs = 0
        readers = 0
        let (frames, cut, _) = ran.insertingAwaits(
            into: ran.unwind(), isJobRunner: { $0 == Self.runner },
            schedulingNow: {
                runs += 1
                return "ran \(runs)"
            }, freshContextReader: reader)
        #expect(cut?.cut == .movedOn)
        #expect(!frames.contains { $0.isAwaitResume })
        #expect(readers == StackUnwinder.chainRereads)
        // It held still: the first reading stands.
        let still = unwinder(memory: fresh, scheduling: "slept") { _, words, _ in words }
        let (_, kept, _) = still.insertingAwaits(
            into: still.unwind(), isJobRunner: { $0 == Self.runner }, schedulingNow: { "slept" })
        #expect(try #require(kept).resumeAddresses == expected)
    }

    @Test(
        "a profile sample whose callers stop early says why where they stop, one name for each kind of cut, no address"
    )
    func cutMarkedInProfile() throws {
        // The chain is cut after its first await: the marker goes between that
        // await and the job runner.
        var memory = Self.contexts(3)
        memory[0x5000_0040] = nil
        memory[0x5000_0048] = nil
        let unwinder = unwinder(memory: memory) { _, words, _ in words }
        let (frames, chain, cutAt) = unwinder.insertingAwaits(
            into: unwinder.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(chain?.cut == .unreadable(0x5000_0040))
        #expect(cutAt == 3)
        var raw = RawStack(thread: 1, frames: frames, copyTruncated: false)
        raw.awaitsCut = chain?.cut
        raw.awaitsCutIndex = cutAt
        let marked = raw.profileFrames
        #expect(marked.map(\.address) == [Self.pc, Self.inPartial, 0x1000_1000, 1, Self.runner, Self.outer])
        #expect(marked[3].isAwaitsCut && !marked[3].isReturnAddress(at: 3) && marked[4].isReturnAddress(at: 4))
        // Samples cut alike at other contexts add up; another kind of cut does not.
        var alike = raw
        alike.awaitsCut = .unreadable(0x5000_0080)
        #expect(alike.profileFrames == marked)
        var other = raw
        other.awaitsCut = .movedOn
        #expect(other.profileFrames != marked)
        // A chain that reached its root: no marker.
        let whole = self.unwinder(memory: Self.contexts(3)) { _, words, _ in words }
        let (all, _, none) = whole.insertingAwaits(into: whole.unwind(), isJobRunner: { $0 == Self.runner })
        #expect(none == nil)
        var complete = RawStack(thread: 1, frames: all, copyTruncated: false)
        complete.awaitsCutIndex = none
        #expect(complete.profileFrames == all)
        // Named: where the callers stop, why, with no address, file or image.
        let named = Symbolicator().symbolicate(other.profileFrames)
        let marker = try #require(named.first { $0.function?.hasPrefix("<awaiting callers") == true })
        let why = "the thread had resumed other code before its awaits could be read"
        #expect(marker.function == "<awaiting callers not all shown: \(why)>")
        #expect(marker.address == 0 && marker.file == nil && marker.image == nil && !marker.isAwaiting)
        #expect(named.firstIndex(of: marker) == 3)
    }

    /// A job that runs another task's job inside it (a task started on an
    /// executor that runs jobs at once): the inner task's partial function and
    /// its runner, the code that ran it (0x1000_0600), then the outer task's
    /// partial function (returning at 0x1000_0700) and its runner. Records at
    /// slots 1, 4, 8, 11, 14 and 17; the inner context at slot 3, the outer at
    /// slot 13.
    static func nestedStackWords(inner: UInt, outer: UInt) -> [UInt] {
        let record = { (slot: Int) in sp + UInt(slot * 8) }
        return [
            0x42, record(4), inPartial, inner, record(8), runner, 0x43, 0x44, record(11), 0x1000_0600, 0x45,
            record(14), 0x1000_0700, outer, record(17), runner, 0x46, 0, Self.outer,
        ]
    }

    func nestedUnwind(
        outer: UInt, memory: [UInt: UInt]
    ) -> (frames: [RawFrame], chain: AsyncContextChain?, cutAt: Int?) {
        let words = Self.nestedStackWords(inner: 0x5000_0000, outer: outer)
        let copy = StackCopy(pc: Self.pc, sp: Self.sp, fp: Self.sp + 8, words: words, truncated: false)
        var unwinder = StackUnwinder(
            copy: copy, isText: { $0 >= 0x1000_0000 && $0 < 0x2000_0000 }, readWord: { memory[$0] },
            callTarget: { _ in .unknown }, tailJumps: { _ in CallSite.TailJumps() })
        unwinder.liveWords = { address, count in
            let slot = Int((address - Self.sp) / 8)
            return Array(words[slot..<(slot + count)])
        }
        return unwinder.insertingAwaits(into: unwinder.unwind(), isJobRunner: { $0 == Self.runner })
    }

    @Test("a task's job run inside another task's job: each task's awaiting callers follow its own partial function")
    func nestedTasks() throws {
        // The outer task's contexts at 0x6000_0000 and up, resuming at
        // 0x1100_1000 and 0x1100_2000.
        var memory = Self.contexts(3)
        memory[0x6000_0000] = 0x6000_0040
        memory[0x6000_0008] = 0x1100_1000
        memory[0x6000_0040] = 0
        memory[0x6000_0048] = 0x1100_2000
        let (frames, chain, cutAt) = nestedUnwind(outer: 0x6000_0000, memory: memory)
        #expect(
            frames.map(\.address) == [
                Self.pc, Self.inPartial, 0x1000_1000, 0x1000_2000, 0x1000_3000, Self.runner, 0x1000_0600,
                0x1000_0700, 0x1100_1000, 0x1100_2000, Self.runner, Self.outer,
            ])
        #expect(frames.filter(\.isAwaitResume).count == 5)
        #expect(chain?.resumeAddresses == [0x1000_1000, 0x1000_2000, 0x1000_3000] && chain?.cut == nil)
        #expect(cutAt == nil)
        // The outer chain cut short: its callers up to the cut, and the cut said.
        memory[0x6000_0040] = nil
        memory[0x6000_0048] = nil
        let (cutFrames, cutChain, cutIndex) = nestedUnwind(outer: 0x6000_0000, memory: memory)
        #expect(cutFrames.filter(\.isAwaitResume).map(\.address).suffix(1) == [0x1100_1000])
        #expect(cutChain?.cut == .unreadable(0x6000_0040))
        #expect(cutIndex == 9 && cutFrames[9].address == Self.runner)
        // The outer job tail-called a runtime entry (`swift_task_switch`, to hop
        // onto an executor that ran it at once): its context slot holds no
        // context (a word not aligned, or one that points at no code), which
        // is no cut.
        for garbage: UInt in [0x6000_0004, 0x7000_0000] {
            let (hop, hopChain, hopCut) = nestedUnwind(outer: garbage, memory: Self.contexts(3))
            #expect(hop.filter(\.isAwaitResume).count == 3 && hopChain?.cut == nil && hopCut == nil, "\(garbage)")
        }
        // The same task's job run inside its own (its context among the awaits
        // shown): no awaits again.
        let (same, sameChain, _) = nestedUnwind(outer: 0x5000_0040, memory: Self.contexts(3))
        #expect(same.filter(\.isAwaitResume).map(\.address) == [0x1000_1000, 0x1000_2000, 0x1000_3000])
        #expect(sameChain?.cut == nil)
    }
}

#if canImport(Glibc)
import Glibc

/// ``StackSampler/readPairs(at:)`` over real memory: what a remembered chain
/// is confirmed with.
@Suite("Context pairs read through the kernel")
struct ContextPairReadTests {
    @Test("pairs spread over pages and ranges, read in one call; nil when one lies in an unmapped page")
    func pairsOverPages() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        // Four pages: 0 and 1 readable, 2 unmapped, 3 readable far from 0.
        let base = try #require(mmap(nil, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
        defer { munmap(base, 4 * page) }
        let start = UInt(bitPattern: base)
        for index in 0..<(4 * page / 8) { base.storeBytes(of: UInt(index), toByteOffset: index * 8, as: UInt.self) }
        munmap(base + 2 * page, page)
        // Out of order, across a page boundary, and in a far page (a range of its own).
        let addresses = [start + 16, start + UInt(page) - 8, start + 3 * UInt(page) + 64, start + 8]
        let pairs = try #require(StackSampler.readPairs(at: addresses)).pairs
        let expected = addresses.flatMap { address in [(address - start) / 8, (address - start) / 8 + 1] }
        #expect(pairs == expected)
        #expect(StackSampler.readPairs(at: addresses + [start + 2 * UInt(page) + 16]) == nil)
        #expect(StackSampler.readPairs(at: [start + 4]) == nil)
        // Between two readings of a span: the span's words before and after.
        let bracketed = try #require(StackSampler.readPairs(at: addresses, between: (start + 3 * UInt(page), 4)))
        #expect(bracketed.pairs == expected)
        let spanWords = (0..<4).map { UInt(3 * page / 8 + $0) }
        #expect(bracketed.before == spanWords && bracketed.after == spanWords)
        #expect(StackSampler.readPairs(at: addresses, between: (start + 2 * UInt(page), 4)) == nil)
    }
}
#endif
