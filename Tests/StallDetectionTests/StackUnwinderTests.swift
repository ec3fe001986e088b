import Testing

@testable import StallDetection

/// The unwinder over synthetic stacks: text is [0x1000_0000, 0x2000_0000), and a
/// return address's call target is given by a table (what the instruction decoder
/// reads from real code).
@Suite("Stack unwinding (synthetic stacks)")
struct StackUnwinderTests {
    static let sp: UInt = 0x7000_0000
    static func isText(_ address: UInt) -> Bool { address >= 0x1000_0000 && address < 0x2000_0000 }

    /// A stack being built upward from `sp`, one word at a time.
    struct Stack {
        var words: [UInt] = []
        var address: UInt { StackUnwinderTests.sp + UInt(words.count * 8) }
        mutating func push(_ word: UInt) { words.append(word) }
    }

    func unwind(
        _ stack: Stack, pc: UInt, fp: UInt?, calls: [UInt: CallSite.Target],
        jumps: [UInt: CallSite.TailJumps] = [:], exactStarts: [UInt: UInt] = [:], copied: Int? = nil,
        code: [UInt: UInt] = [:]
    ) -> [RawFrame] {
        // With `copied`, only the first `copied` words are in the copy; the rest
        // can be read from "memory".
        let words = copied.map { Array(stack.words.prefix($0)) } ?? stack.words
        let memory = stack.words
        let copy = StackCopy(pc: pc, sp: Self.sp, fp: fp, words: words, truncated: copied != nil)
        let unwinder = StackUnwinder(
            copy: copy, isText: Self.isText,
            readWord: { address in
                if let word = code[address] { return word }
                guard copied != nil, address >= Self.sp, (address - Self.sp) % 8 == 0 else { return nil }
                let index = Int((address - Self.sp) / 8)
                return index < memory.count ? memory[index] : nil
            },
            callTarget: { calls[$0] ?? .none },
            exactStart: exactStarts.isEmpty ? nil : { _, inner, _ in exactStarts[inner] },
            tailJumps: { jumps[$0] ?? CallSite.TailJumps() })
        return unwinder.unwind()
    }

    /// Pushes a chain of frame records, innermost first, each with its return
    /// address; the outermost record's saved frame pointer is 0. Returns the address
    /// of the first record.
    func pushChain(_ stack: inout Stack, returns: [UInt], localsPerFrame: Int = 2) -> UInt {
        let first = stack.address
        for (index, returnAddress) in returns.enumerated() {
            let record = stack.address
            let next = record + UInt((2 + localsPerFrame) * 8)
            stack.push(index == returns.count - 1 ? 0 : next)
            stack.push(returnAddress)
            for local in 0..<localsPerFrame { stack.push(0xdead_0000 + UInt(local)) }
        }
        return first
    }

    @Test(
        "a stale return address whose callee's tail calls end in the library, near the frame above: a frame only while the library's function starts are unknown"
    )
    func staleCallerThroughTailCallsIntoTheLibrary() {
        // A thread asleep in `__lll_lock_wait_private` (library, 0x1900_5000) ←
        // `malloc` (0x1900_0000) ← `swift_slowAlloc` (0x1803_0000) ←
        // `swift_allocObject`, whose frame record ends the gap. Left in the gap from
        // an earlier, deeper call: a return address after `call queueBlocker`
        // (executable, 0x1000_0100), which tail-calls `blackHole`, which tail-calls
        // `swift_release` (library, 0x1800_0000): 192 KB before `swift_slowAlloc`.
        // Seen in `stall-probe many-loops 32`: `queueBlocker` between
        // `swift_slowAlloc` and `swift_allocObject` in a stall's report.
        let pc: UInt = 0x1900_5010
        let inMalloc: UInt = 0x1900_0100
        let inSlowAlloc: UInt = 0x1803_0020
        let stale: UInt = 0x1000_0154
        let inAllocObject: UInt = 0x1803_1040
        var stack = Stack()
        stack.push(inMalloc)
        stack.push(0x7)
        stack.push(inSlowAlloc)
        stack.push(stale)
        let returns = [inAllocObject, 0x1000_0800]
        _ = pushChain(&stack, returns: returns)
        let calls: [UInt: CallSite.Target] = [
            inMalloc: .known(0x1900_5000), inSlowAlloc: .known(0x1900_0000), stale: .known(0x1000_0100),
            inAllocObject: .unknown, 0x1000_0800: .unknown,
        ]
        let jumps: [UInt: CallSite.TailJumps] = [
            0x1000_0100: CallSite.TailJumps(targets: [0x1000_0400]),
            0x1000_0400: CallSite.TailJumps(targets: [0x1800_0000]),
        ]
        // The executable's own functions are known either way; the library's
        // only with its symbol table's sizes.
        let executable: [UInt: UInt] = [0x1000_0800: 0x1000_0700]
        let loose = unwind(stack, pc: pc, fp: nil, calls: calls, jumps: jumps, exactStarts: executable)
        #expect(loose.map(\.address) == [pc, inMalloc, inSlowAlloc, stale] + returns, "the defect this guards against")
        let library: [UInt: UInt] = [pc: 0x1900_5000, inMalloc: 0x1900_0000, inSlowAlloc: 0x1803_0000]
        let exact = unwind(
            stack, pc: pc, fp: nil, calls: calls, jumps: jumps, exactStarts: executable.merging(library) { $1 })
        #expect(exact.map(\.address) == [pc, inMalloc, inSlowAlloc] + returns)
        #expect(exact.allSatisfy { !$0.isUncertain })
    }

    @Test("a 200-deep recursion keeps all 200 frames, in order, from the frame-pointer chain")
    func recursionIsNotCollapsed() {
        var stack = Stack()
        let recurse: UInt = 0x1000_1234
        let returns = Array(repeating: recurse, count: 200) + [0x1000_5000, 0x1000_6000]
        let fp = pushChain(&stack, returns: returns)
        let calls = Dictionary(uniqueKeysWithValues: Set(returns).map { ($0, CallSite.Target.unknown) })
        let frames = unwind(stack, pc: 0x1000_1200, fp: fp, calls: calls)
        #expect(frames.map(\.address) == [0x1000_1200] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a signal sample inside a frameless leaf: the caller's return address above the register's record is a frame")
    func framelessLeafAboveRegisterRecord() {
        // pc in memset (starts 0x1800_0000), which pushed nothing; its caller
        // (starts 0x1000_0080, returns at 0x1000_0100) has the frame record the
        // frame-pointer register names. A stale word between whose call targets
        // elsewhere is no frame.
        let pc: UInt = 0x1800_0040
        let inCaller: UInt = 0x1000_0100
        let stale: UInt = 0x1000_0999
        var stack = Stack()
        stack.push(inCaller)
        stack.push(stale)
        stack.push(0x42)
        let returns: [UInt] = [0x1000_0200, 0x1000_0300, 0x1000_0400]
        let fp = pushChain(&stack, returns: returns)
        var calls: [UInt: CallSite.Target] = [inCaller: .known(0x1800_0000), stale: .known(0x1900_0000)]
        for address in returns { calls[address] = .known(0x1000_0080) }
        let frames = unwind(stack, pc: pc, fp: fp, calls: calls)
        #expect(frames.map(\.address) == [pc, inCaller] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
        // The interrupted function has a record of its own: nothing above it is added.
        calls[returns[0]] = .known(0x1800_0000)
        let own = unwind(stack, pc: pc, fp: fp, calls: calls)
        #expect(own.map(\.address) == [pc] + returns)
    }

    @Test(
        "a sample at a frameless function's entry, its second instruction or its ret: the caller called through a register is a frame",
        arguments: [
            // (the 8 code bytes from pc - 1, little-endian; the slot of the return address)
            (UInt(0x90_90_E5_89_48_55_C3_CC), 0),  // pc at push %rbp
            (UInt(0x90_90_90_5D_E5_89_48_55), 1),  // pc at mov %rsp,%rbp, after push %rbp
            (UInt(0x90_90_90_90_90_90_C3_5D), 0),  // pc at ret
            (UInt(0x90_90_55_FA_1E_0F_F3_CC), 0),  // pc at endbr64
        ])
    func interruptedAtEntryOrReturn(code: UInt, slot: Int) {
        // pc in a value witness (0x1800_0000) called through a register from the
        // user's spinning loop (returns at 0x1000_0100); the register still names
        // the loop's record, whose return address (0x1000_0200) is its caller's.
        let pc: UInt = 0x1800_0000
        let inLoop: UInt = 0x1000_0100
        var stack = Stack()
        if slot == 1 { stack.push(0x7000_0100) }  // the saved frame pointer just pushed
        stack.push(inLoop)
        stack.push(0x42)
        let returns: [UInt] = [0x1000_0200, 0x1000_0300, 0x1000_0400]
        let fp = pushChain(&stack, returns: returns)
        var calls: [UInt: CallSite.Target] = [inLoop: .unknown]
        for address in returns { calls[address] = .known(0x1000_0080) }
        let frames = unwind(stack, pc: pc, fp: fp, calls: calls, code: [pc - 1: code])
        #expect(frames.map(\.address) == [pc, inLoop] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
        // Elsewhere in the function (a nop), an unprovable word is no frame.
        let inside = unwind(stack, pc: pc, fp: fp, calls: calls, code: [pc - 1: 0x90_90_90_90_90_90_90_90])
        #expect(inside.map(\.address) == [pc] + returns)
    }

    @Test("a frame-pointer register holding data (libc built without frame pointers): the chain is found by the scan")
    func framePointerRegisterHoldingData() {
        // The register points into the stack at words that are no frame record.
        let pc: UInt = 0x1800_0040
        let inUser: UInt = 0x1000_0100
        var stack = Stack()
        stack.push(0x42)
        let data = stack.address
        stack.push(0x1000_0050)  // looks like text, but no call precedes it
        stack.push(0x1000_0060)
        stack.push(inUser)
        let returns: [UInt] = [0x1000_0200, 0x1000_0300, 0x1000_0400]
        _ = pushChain(&stack, returns: returns)
        var calls: [UInt: CallSite.Target] = [inUser: .known(0x1800_0000)]
        for address in returns { calls[address] = .known(0x1000_0080) }
        let frames = unwind(stack, pc: pc, fp: data, calls: calls)
        #expect(frames.map(\.address) == [pc, inUser] + returns)
    }

    @Test("a thread asleep in the kernel: libc frames proven by their calls, stale words dropped, then the chain")
    func kernelSampleWithoutFramePointer() {
        // pc in clock_nanosleep (starts 0x1800_0000); nanosleep (0x1800_1000) called
        // it; usleep (0x1800_2000) called nanosleep; user code called usleep.
        let pc: UInt = 0x1800_0040
        let inNanosleep: UInt = 0x1800_1020
        let stale: UInt = 0x1800_9999  // an old return address: its call targets elsewhere
        let inUsleep: UInt = 0x1800_2030
        let inUser: UInt = 0x1000_0100
        var stack = Stack()
        stack.push(0x42)
        stack.push(inNanosleep)
        stack.push(stale)
        stack.push(inUsleep)
        stack.push(7)
        stack.push(inUser)
        stack.push(0x43)
        _ = pushChain(&stack, returns: [0x1000_0200, 0x1000_0300, 0x1000_0400])
        let calls: [UInt: CallSite.Target] = [
            inNanosleep: .known(0x1800_0000), stale: .known(0x1900_0000), inUsleep: .known(0x1800_1000),
            inUser: .known(0x1800_2000), 0x1000_0200: .unknown, 0x1000_0300: .unknown, 0x1000_0400: .unknown,
        ]
        let frames = unwind(stack, pc: pc, fp: nil, calls: calls)
        #expect(frames.map(\.address) == [pc, inNanosleep, inUsleep, inUser, 0x1000_0200, 0x1000_0300, 0x1000_0400])
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a stale word after an indirect call, between a sleeping function and its callers' chain, derails nothing")
    func staleIndirectWordBetweenCertainFrames() {
        // pc in clock_nanosleep; nanosleep, usleep, then userSleep (starts
        // 0x1000_0080) called usleep. Above userSleep's locals lies a stale return
        // address after an indirect call; then the frame records: recurse (starts
        // 0x1000_0180) called userSleep, recurse called recurse twice, and a thunk
        // called recurse through a register (an unknown target).
        let pc: UInt = 0x1800_0040
        let inNanosleep: UInt = 0x1800_1020
        let inUsleep: UInt = 0x1800_2030
        let inUserSleep: UInt = 0x1000_0100
        let staleIndirect: UInt = 0x1700_0040
        let recurseCallsSleep: UInt = 0x1000_0200
        let recurseCallsRecurse: UInt = 0x1000_0210
        let thunkCallsRecurse: UInt = 0x1000_0500
        var stack = Stack()
        stack.push(0x42)
        stack.push(inNanosleep)
        stack.push(inUsleep)
        stack.push(inUserSleep)
        stack.push(staleIndirect)
        stack.push(0x43)
        let returns = [recurseCallsSleep, recurseCallsRecurse, recurseCallsRecurse, thunkCallsRecurse, 0x1000_0600]
        _ = pushChain(&stack, returns: returns)
        let calls: [UInt: CallSite.Target] = [
            inNanosleep: .known(0x1800_0000), inUsleep: .known(0x1800_1000), inUserSleep: .known(0x1800_2000),
            staleIndirect: .unknown, recurseCallsSleep: .known(0x1000_0080), recurseCallsRecurse: .known(0x1000_0180),
            thunkCallsRecurse: .unknown, 0x1000_0600: .unknown,
        ]
        let frames = unwind(stack, pc: pc, fp: nil, calls: calls)
        #expect(frames.map(\.address) == [pc, inNanosleep, inUsleep, inUserSleep] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a stale return address in the sleeping function's own locals is not proven by its caller's record")
    func staleWordInSameFunction() {
        // As above, but the leftover return address lies in userSleep itself
        // (starts 0x1000_0080): a call userSleep made before a dynamic allocation
        // moved its stack pointer down (a resilient value in a debug build, seen
        // as `matrixSleep` twice in a row). The record's call reaches userSleep,
        // which the live return address below already is.
        let pc: UInt = 0x1800_0040
        let inNanosleep: UInt = 0x1800_1020
        let inUsleep: UInt = 0x1800_2030
        let inUserSleep: UInt = 0x1000_0100
        let staleInUserSleep: UInt = 0x1000_0090
        let recurseCallsSleep: UInt = 0x1000_0200
        var stack = Stack()
        stack.push(0x42)
        stack.push(inNanosleep)
        stack.push(inUsleep)
        stack.push(inUserSleep)
        stack.push(0x2)
        stack.push(staleInUserSleep)
        stack.push(0x43)
        let returns = [recurseCallsSleep, 0x1000_0600]
        _ = pushChain(&stack, returns: returns)
        let starts: [UInt: UInt] = [
            inUserSleep: 0x1000_0080, staleInUserSleep: 0x1000_0080, recurseCallsSleep: 0x1000_0180,
        ]
        for staleCall in [CallSite.Target.unknown, .known(0x1100_0000)] {
            let calls: [UInt: CallSite.Target] = [
                inNanosleep: .known(0x1800_0000), inUsleep: .known(0x1800_1000), inUserSleep: .known(0x1800_2000),
                staleInUserSleep: staleCall, recurseCallsSleep: .known(0x1000_0080), 0x1000_0600: .unknown,
            ]
            let jumps: [UInt: CallSite.TailJumps] = [0x1100_0000: CallSite.TailJumps(indirect: true)]
            let frames = unwind(stack, pc: pc, fp: nil, calls: calls, jumps: jumps, exactStarts: starts)
            #expect(frames.map(\.address) == [pc, inNanosleep, inUsleep, inUserSleep] + returns, "\(staleCall)")
            #expect(frames.allSatisfy { !$0.isUncertain })
        }
    }

    @Test("a stale frame record after an indirect call, linking into the live chain, is not taken for a frame")
    func staleIndirectRecordBelowLiveFrame() {
        // As above, but the leftover is a whole frame record (a saved frame pointer
        // into the live chain, then a return address after `call *%rax`), left in
        // userSleep's locals by a runtime call that returned long ago: it validates
        // like a live record. Seen in a debug build: swift_getTypeByMangledName
        // between matrixSleep and matrixRecurse.
        let pc: UInt = 0x1800_0040
        let inNanosleep: UInt = 0x1800_1020
        let inUsleep: UInt = 0x1800_2030
        let inUserSleep: UInt = 0x1000_0100
        let staleIndirect: UInt = 0x1700_0040
        let recurseCallsSleep: UInt = 0x1000_0200
        let recurseCallsRecurse: UInt = 0x1000_0210
        let thunkCallsRecurse: UInt = 0x1000_0500
        var stack = Stack()
        stack.push(0x42)
        stack.push(inNanosleep)
        stack.push(inUsleep)
        stack.push(inUserSleep)
        let liveRecord = stack.address + 3 * 8
        stack.push(liveRecord)  // the stale record: saved frame pointer…
        stack.push(staleIndirect)  // …and its return address
        stack.push(0x43)
        let returns = [recurseCallsSleep, recurseCallsRecurse, recurseCallsRecurse, thunkCallsRecurse, 0x1000_0600]
        #expect(pushChain(&stack, returns: returns) == liveRecord)
        let calls: [UInt: CallSite.Target] = [
            inNanosleep: .known(0x1800_0000), inUsleep: .known(0x1800_1000), inUserSleep: .known(0x1800_2000),
            staleIndirect: .unknown, recurseCallsSleep: .known(0x1000_0080), recurseCallsRecurse: .known(0x1000_0180),
            thunkCallsRecurse: .unknown, 0x1000_0600: .unknown,
        ]
        let frames = unwind(stack, pc: pc, fp: nil, calls: calls)
        #expect(frames.map(\.address) == [pc, inNanosleep, inUsleep, inUserSleep] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a wrapper that tail-calls into libc (`func f() { usleep(n) }`) leaves its caller's frame proven")
    func tailCallWrapper() {
        // pc in clock_nanosleep; nanosleep, usleep; then the caller of the wrapper
        // (the wrapper jumped to usleep, so it has no frame); then the chain.
        let pc: UInt = 0x1800_0040
        let inNanosleep: UInt = 0x1800_1020
        let inUsleep: UInt = 0x1800_2030
        let callerCallsWrapper: UInt = 0x1000_0210  // call wrapper (0x1000_0080)
        let outer: UInt = 0x1000_0500
        var stack = Stack()
        stack.push(inNanosleep)
        stack.push(inUsleep)
        stack.push(callerCallsWrapper)
        stack.push(0x43)
        let returns = [outer, 0x1000_0600]
        _ = pushChain(&stack, returns: returns)
        let calls: [UInt: CallSite.Target] = [
            inNanosleep: .known(0x1800_0000), inUsleep: .known(0x1800_1000), callerCallsWrapper: .known(0x1000_0080),
            outer: .known(0x1000_0200), 0x1000_0600: .unknown,
        ]
        let jumps: [UInt: CallSite.TailJumps] = [0x1000_0080: CallSite.TailJumps(targets: [0x1800_2000])]
        let frames = unwind(stack, pc: pc, fp: nil, calls: calls, jumps: jumps)
        #expect(frames.map(\.address) == [pc, inNanosleep, inUsleep, callerCallsWrapper] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
        // Without the wrapper's jump the caller cannot be proven, and is not shown as proven.
        let unproven = unwind(stack, pc: pc, fp: nil, calls: calls)
        #expect(!unproven.contains { $0.address == callerCallsWrapper && !$0.isUncertain })
    }

    @Test("a frame after a call through a register (a class method) is proven by the record that calls its function")
    func indirectCallProvenByRecord() {
        // pthread_mutex_lock's caller called `lock()` through a vtable (unknown
        // target); a stale word of another library lies above it; then the record
        // whose call targets the function the first word lies in.
        let pc: UInt = 0x1800_0040
        let inLock: UInt = 0x1800_1020
        let userCallsLock: UInt = 0x1000_0110  // in userWait, which starts at 0x1000_0080
        let stale: UInt = 0x1700_0040
        let callerCallsUserWait: UInt = 0x1000_0210
        var stack = Stack()
        stack.push(inLock)
        stack.push(userCallsLock)
        stack.push(stale)
        stack.push(0x43)
        let returns = [callerCallsUserWait, 0x1000_0600]
        _ = pushChain(&stack, returns: returns)
        let calls: [UInt: CallSite.Target] = [
            inLock: .known(0x1800_1000), userCallsLock: .unknown, stale: .unknown,
            callerCallsUserWait: .known(0x1000_0080), 0x1000_0600: .unknown,
        ]
        let frames = unwind(stack, pc: pc, fp: nil, calls: calls, exactStarts: [userCallsLock: 0x1000_0080])
        #expect(frames.map(\.address) == [pc, inLock, userCallsLock] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a chain broken by a function without frame pointer (qsort calling back) resumes at the next record")
    func chainResumesAfterGap() {
        var stack = Stack()
        // Inner chain: the callback's two frames, ending in a saved frame pointer
        // that is not a record (qsort uses the register for data).
        let callbackRecord = stack.address
        stack.push(0x5)  // garbage saved frame pointer: below the record, so the chain stops
        stack.push(0x1000_0010)  // return into the comparator's caller… inside qsort's helper
        let qsortInner: UInt = 0x1800_0100
        stack.push(qsortInner)  // return into qsort_r, from msort
        stack.push(0x99)
        let userCaller: UInt = 0x1000_0500
        stack.push(userCaller)  // return into the Swift closure that called qsort
        _ = pushChain(&stack, returns: [0x1000_0600, 0x1000_0700, 0x1000_0800])
        let calls: [UInt: CallSite.Target] = [
            0x1000_0010: .unknown, qsortInner: .known(0x1000_0000), userCaller: .known(0x1800_0000),
            0x1000_0600: .unknown, 0x1000_0700: .unknown, 0x1000_0800: .unknown,
        ]
        let frames = unwind(stack, pc: 0x1000_0001, fp: callbackRecord, calls: calls)
        #expect(
            frames.map(\.address) == [
                0x1000_0001, 0x1000_0010, qsortInner, userCaller, 0x1000_0600, 0x1000_0700, 0x1000_0800,
            ])
    }

    @Test("a /proc syscall line gives the stack pointer and program counter; running gives nothing")
    func syscallLine() {
        let line = "230 0x1 0x0 0x7ffd5f1ff8b0 0x0 0x0 0x0 0x7ffd5f1ff878 0x7f2971714545\n"
        let parsed = StackSampler.parseSyscall(line)
        #expect(parsed?.sp == 0x7ffd_5f1f_f878)
        #expect(parsed?.pc == 0x7f29_7171_4545)
        #expect(StackSampler.parseSyscall("-1 0x7ffd5f1ff878 0x7f2971714545\n")?.pc == 0x7f29_7171_4545)
        #expect(StackSampler.parseSyscall("running\n") == nil)
    }

    func frame(_ name: String, address: UInt = 0x10, line: Int? = nil) -> StackFrame {
        StackFrame(address: address, function: name, file: "/a.swift", line: line, image: "App", isUncertain: false)
    }

    @Test("a caller of a frameless function (no frame record of its own) between two records is kept")
    func framelessFunctionsCaller() {
        // G (pc) has a record whose return address is in F; F keeps no record
        // (`DispatchSemaphore.wait(wallTimeout:)`), so G's saved frame pointer is
        // user's: the next record is user's, returning into a thunk that called it
        // through a register. user's own return address into F's caller sits in
        // between, in no record.
        let pc: UInt = 0x1800_0040  // in G
        let inF: UInt = 0x1700_0120  // F starts at 0x1700_0100
        let inUser: UInt = 0x1000_0110  // user called F
        let inThunk: UInt = 0x1000_0500  // the thunk called user through a register
        let root: UInt = 0x1000_0600
        var stack = Stack()
        stack.push(0x41)  // G's locals
        let gRecord = stack.address
        let userRecord = gRecord + 6 * 8
        stack.push(userRecord)  // G's record: saved frame pointer (user's: F kept none)…
        stack.push(inF)  // …and its return address, into F
        stack.push(0x42)  // F's locals
        stack.push(inUser)  // user's call of F
        stack.push(0x43)  // user's locals
        stack.push(0x44)
        #expect(stack.address == userRecord)
        _ = pushChain(&stack, returns: [inThunk, root])
        let calls: [UInt: CallSite.Target] = [
            inF: .known(0x1800_0000), inUser: .known(0x1700_0100), inThunk: .unknown, root: .unknown,
        ]
        let frames = unwind(stack, pc: pc, fp: gRecord, calls: calls)
        #expect(frames.map(\.address) == [pc, inF, inUser, inThunk, root])
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a chain deeper than the copy is followed through memory to the thread's root")
    func chainBeyondTheCopy() {
        var stack = Stack()
        let recurse: UInt = 0x1000_1234
        let returns = Array(repeating: recurse, count: 3000) + [0x1000_5000, 0x1000_6000]
        let fp = pushChain(&stack, returns: returns, localsPerFrame: 60)  // fat frames: 62 words each
        let calls = Dictionary(uniqueKeysWithValues: Set(returns).map { ($0, CallSite.Target.unknown) })
        // The copy holds about 500 of the 3,002 frames.
        let frames = unwind(stack, pc: 0x1000_1200, fp: fp, calls: calls, copied: 32_768)
        #expect(frames.map(\.address) == [0x1000_1200] + returns)
        #expect(frames.allSatisfy { !$0.isUncertain })
    }

    @Test("a recursion prints on one line with its count; the root is kept")
    func compactRecursion() {
        let frames =
            [frame("usleep", address: 1)] + Array(repeating: frame("recurse(depth:)", address: 2, line: 9), count: 200)
            + [frame("main", address: 3), frame("start_thread", address: 4)]
        let text = StallBacktrace(frames: frames, threadID: 1, unavailableReason: nil).description
        #expect(text.contains("#1–#200 0x000000000002 recurse(depth:) at /a.swift:9 (App) × 200"))
        #expect(text.contains("#202 0x000000000004 start_thread"))
        #expect(!text.contains("not shown"))
    }

    @Test("a recursion through several frames (a closure and its function) prints the group once with its count")
    func compactGroupRecursion() {
        let group = [
            frame("closure #1 in walk(_:)", address: 20, line: 5), frame("walk(_:)", address: 21, line: 7),
        ]
        let frames =
            [frame("usleep", address: 1), frame("leaf()", address: 2)]
            + Array(Array(repeating: group, count: 300).joined()) + [frame("main", address: 3)]
        let text = StallBacktrace(frames: frames, threadID: 1, unavailableReason: nil).description
        #expect(text.contains("#2–#601 × 300, each time these 2 frames:"), "\(text)")
        #expect(text.split(separator: "\n").count < 10, "\(text)")
        #expect(text.contains("#602 0x000000000003 main"))
        // Two repetitions of a group are printed as they are.
        let twice = [frame("usleep", address: 1)] + group + group + [frame("main", address: 3)]
        let plain = StallBacktrace(frames: twice, threadID: 1, unavailableReason: nil).description
        #expect(!plain.contains("×") && plain.contains("#4 0x000000000015 walk(_:)"), "\(plain)")
    }

    @Test("a stack deeper than the limit keeps its innermost and outermost frames and says how many are missing")
    func omittedFrames() {
        let frames =
            [frame("usleep", address: 1)]
            + (0..<2000).map { frame("level\($0)", address: UInt(100 + $0)) } + [frame("start_thread", address: 5)]
        let backtrace = StallBacktrace(frames: frames, threadID: 1, unavailableReason: nil)
        #expect(backtrace.frames.count == StallBacktrace.maximumFrameCount)
        #expect(backtrace.omittedFrameCount == 2002 - StallBacktrace.maximumFrameCount)
        #expect(backtrace.frames.first?.function == "usleep")
        #expect(backtrace.frames.last?.function == "start_thread")
        #expect(backtrace.description.contains("… \(backtrace.omittedFrameCount) frames not shown"))
    }

    @Test("inlined frames print their flag; the compact format encodes each frame's kind")
    func inlinedAndKinds() {
        let inlined = StackFrame(
            address: 0x20, function: "helper()", file: "/a.swift", line: 3, image: "App", isUncertain: false,
            isInlined: true)
        #expect(inlined.description.hasSuffix("(App) [inlined]"))
        #expect(CompactBacktrace.encode([(0x10, false), (0x20, false)]) == [0x02, 0x10, 0x10, 0x10, 0x10, 0x00])
        #expect(CompactBacktrace.encode([(0x10, false), (0x20, true)]) == [0x02, 0x10, 0x10, 0x20, 0x10, 0x00])
    }
}

@Suite("Stops (virtual time)")
struct StopRuleTests {
    let ms: Int64 = 1_000_000

    @Test("a probe owed when the process stopped is owed afresh from the continue")
    func pendingProbeRestarts() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        tracker.probeSent(at: 25 * ms)
        // Stopped at 30 ms, continued at 630 ms: the detector looks at 640 ms.
        tracker.continued(at: 630 * ms, lastObservation: 30 * ms)
        #expect(tracker.tick(now: 640 * ms) == nil)
        #expect(tracker.dueTime == 880 * ms)
        #expect(tracker.progress(at: 650 * ms) == nil, "the answer after the continue ends nothing")
    }

    @Test("a stall in progress loses the stopped time from its duration")
    func openStallLosesGap() {
        var tracker = StallTracker(threshold: 250 * ms, now: 0)
        tracker.probeSent(at: 0)
        guard case .started? = tracker.tick(now: 250 * ms) else {
            Issue.record("expected a start")
            return
        }
        // Seen at 275 ms, stopped, continued at 2275 ms, answered at 2375 ms.
        tracker.continued(at: 2_275 * ms, lastObservation: 275 * ms)
        guard case .ended(_, let duration)? = tracker.progress(at: 2_375 * ms) else {
            Issue.record("expected an end")
            return
        }
        #expect(duration == 375 * ms)
    }
}

#if os(Linux)
import Glibc

/// A stale image map: a page that was text when the map was taken and is not
/// readable now. Decoding the call before a "return address" at its start read
/// the page directly and crashed the process (a CI run: SIGSEGV at
/// 0x7fe5fffffffb, in `CallSite.decode`).
@Suite("Stack unwinding over a stale image map")
struct StaleImageMapTests {
    @Test("words pointing just past an unreadable page's start are no return addresses, and nothing faults")
    func unreadableText() throws {
        let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        // Two pages: the first inaccessible, the second readable; addresses at the
        // start of the second have their call bytes in the first.
        guard let region = mmap(nil, 2 * pageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            region != MAP_FAILED
        else {
            Issue.record("mmap failed")
            return
        }
        defer { munmap(region, 2 * pageSize) }
        let second = UInt(bitPattern: region) + UInt(pageSize)
        #expect(mprotect(UnsafeMutableRawPointer(bitPattern: second), pageSize, PROT_READ) == 0)
        let base = UInt(bitPattern: region)
        let staleText = base..<(base + UInt(2 * pageSize))
        let sp: UInt = 0x7000_0000
        // What a sleeping thread's stack could hold: words into the stale text
        // (the first page and the second page's first bytes), no frame pointer.
        let words: [UInt] = [second + 3, base + 16, second + 5, second + 100, 0, 0]
        let copy = StackCopy(pc: second + 200, sp: sp, fp: nil, words: words, truncated: false)
        let unwinder = StackUnwinder(
            copy: copy, isText: { staleText.contains($0) },
            readWord: { address in
                var value: UInt = 0
                let copied = withUnsafeMutableBytes(of: &value) { StackSampler.copyMemory(from: address, into: $0) }
                return copied == 1 ? value : nil
            })
        let frames = unwinder.unwind()
        // The second page is zero-filled (no call instructions) and the first
        // cannot be read: nothing but the interrupted pc is a frame.
        #expect(frames.map(\.address) == [second + 200])
    }
}
#endif
