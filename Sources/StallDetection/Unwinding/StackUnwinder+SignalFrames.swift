import CStallCapture

/// Signal frames: a thread that runs a signal handler has, above the handler's
/// frames, the kernel's signal frame (x86-64 Linux: `rt_sigframe`). Its first
/// word is the handler's return address, the signal return trampoline
/// (`__restore_rt` in glibc: `mov $15, %rax; syscall`); then the `ucontext_t`
/// whose `uc_mcontext` holds the interrupted code's registers; then `siginfo_t`
/// and the saved floating-point state, whose unwritten parts keep whatever the
/// stack held before (return addresses and frame records of calls that returned
/// long ago).
///
/// The unwinder recognises the trampoline by its code (read through `readWord`,
/// never directly) and continues, as a debugger does, from the saved `rip`,
/// `rsp` and `rbp`: in the same copy when the interrupted stack pointer lies in
/// it above the frame, else in a second copy taken from that stack pointer (a
/// handler on an alternate signal stack). Nothing between the trampoline's slot
/// and the interrupted stack pointer becomes a frame.
extension StackUnwinder {
    /// The interrupted code's registers, from a signal frame's `ucontext_t`.
    struct SignalContext: Equatable {
        var pc: UInt
        var sp: UInt
        var fp: UInt
    }

    /// How many signal frames one unwind follows (a handler interrupted by
    /// another signal whose handler runs on top, …).
    static let signalFrameLimit = 4

    /// Word offsets from the trampoline's slot (x86-64): `uc_flags`, `uc_link`,
    /// the saved `rbp`, `rsp`, `rip` (`uc_mcontext.gregs[REG_RBP]`, `[REG_RSP]`,
    /// `[REG_RIP]`), and `uc_mcontext.fpregs`, the pointer to the saved
    /// floating-point state (which the kernel places just above the frame).
    private enum FrameLayout {
        static let flags = 1
        static let link = 2
        static let rbp = 16
        static let rsp = 21
        static let rip = 22
        static let fpregs = 29
    }

    /// Whether the code at `address` is a signal return trampoline: `mov $15,
    /// %rax; syscall` (glibc's `__restore_rt`) or `mov $15, %eax; syscall` (musl's).
    /// Read through `readWord`, remembered in the code cache.
    func isSignalReturn(_ address: UInt) -> Bool {
        #if arch(x86_64) && os(Linux)
        if let known = codeCache.isSignalReturn(address) { return known }
        var found = false
        if let first = readWord(address) {
            if first == 0x0F00_0000_0FC0_C748, let next = readWord(address &+ 1), next >> 56 == 0x05 {
                found = true  // 48 c7 c0 0f 00 00 00 0f 05
            } else if first & 0x00FF_FFFF_FFFF_FFFF == 0x0005_0F00_0000_0FB8 {
                found = true  // b8 0f 00 00 00 0f 05
            }
        }
        codeCache.remember(signalReturn: found, at: address)
        return found
        #else
        return false
        #endif
    }

    /// The interrupted registers of the signal frame whose trampoline address is
    /// in the copy's slot `slot`, when the word there is a trampoline and the
    /// context behind it is one the kernel wrote: `uc_flags` small, no
    /// `uc_link`, a program counter and a stack pointer, the floating-point state
    /// just above the frame, and an interrupted stack pointer above the frame
    /// (or outside this copy: another stack).
    func signalContext(atSlot slot: Int) -> SignalContext? {
        #if arch(x86_64) && os(Linux)
        let words = copy.words
        guard slot >= 0, slot < words.count, isText(words[slot]), isSignalReturn(words[slot]) else { return nil }
        let base = copy.sp + UInt(slot) * UInt(MemoryLayout<UInt>.size)
        func field(_ offset: Int) -> UInt? {
            slot + offset < words.count
                ? words[slot + offset] : readWord(base + UInt(offset * MemoryLayout<UInt>.size))
        }
        guard let flags = field(FrameLayout.flags), flags < 0x100, field(FrameLayout.link) == 0,
            let pc = field(FrameLayout.rip), pc != 0, let sp = field(FrameLayout.rsp), sp != 0,
            let fp = field(FrameLayout.rbp), let fpregs = field(FrameLayout.fpregs)
        else { return nil }
        let frameEnd = base + UInt(FrameLayout.fpregs * MemoryLayout<UInt>.size)
        guard fpregs == 0 || (fpregs > frameEnd && fpregs - frameEnd < 0x1_0000) else { return nil }
        let copyEnd = copy.sp + UInt(words.count * MemoryLayout<UInt>.size)
        let onThisStack = sp >= copy.sp && sp < copyEnd
        guard !onThisStack || sp > frameEnd else { return nil }
        return SignalContext(pc: pc, sp: sp, fp: fp)
        #else
        return nil
        #endif
    }

    /// Whether a signal frame whose saved frame pointer is `record` lies between
    /// the stack pointer and `record`: the frame-pointer register then still
    /// holds the interrupted code's (the handler has no frame record).
    func signalFrameBelow(_ record: UInt) -> Bool {
        guard record > copy.sp else { return false }
        let end = min(copy.words.count, Int((record - copy.sp) / UInt(MemoryLayout<UInt>.size)))
        for slot in 0..<end where signalContext(atSlot: slot)?.fp == record { return true }
        return false
    }

    /// Whether `inner` can lie in an installed signal handler: one starts at most
    /// 256 KB before it (``leads(to:from:)``).
    func runsSignalHandler(_ inner: UInt) -> Bool {
        if scratch.signalHandlers == nil {
            #if os(Linux)
            scratch.signalHandlers = (1...64).map { UInt(stallcapture_signal_handler(Int32($0))) }.filter { $0 > 1 }
            #else
            scratch.signalHandlers = []
            #endif
        }
        return scratch.signalHandlers!.contains { Self.leads(to: inner, from: $0) }
    }

    /// The handler's frames (those below the trampoline's slot), the trampoline,
    /// then the interrupted code's: above the slot lie the kernel's frame and the
    /// interrupted stack, unwound from the saved registers.
    func framesThroughSignalFrame(
        at signalSlot: Int, context: SignalContext, handlerFrames bySlot: [Int: RawFrame]
    ) -> [RawFrame] {
        var frames = [RawFrame(address: copy.pc, isUncertain: false)]
        for slot in bySlot.keys.sorted() where slot < signalSlot { frames.append(bySlot[slot]!) }
        frames.append(RawFrame(address: copy.words[signalSlot], isUncertain: false, isSignalReturn: true))
        return frames + framesInterrupted(by: context, depth: signalDepth)
    }

    /// The interrupted code's frames: its program counter, then its callers,
    /// unwound from the saved registers in this copy (above the signal frame) or
    /// in a copy of its own stack.
    func framesInterrupted(by context: SignalContext, depth: Int) -> [RawFrame] {
        guard depth < Self.signalFrameLimit else { return [RawFrame(address: context.pc, isUncertain: false)] }
        let wordSize = UInt(MemoryLayout<UInt>.size)
        let copyEnd = copy.sp + UInt(copy.words.count) * wordSize
        let interrupted: StackCopy
        if context.sp >= copy.sp, context.sp < copyEnd, (context.sp - copy.sp) % wordSize == 0 {
            let first = Int((context.sp - copy.sp) / wordSize)
            interrupted = StackCopy(
                pc: context.pc, sp: context.sp, fp: context.fp, words: Array(copy.words[first...]),
                truncated: copy.truncated)
        } else {
            let (words, truncated) = (copyStack ?? Self.copyStack)(context.sp)
            interrupted = StackCopy(pc: context.pc, sp: context.sp, fp: context.fp, words: words, truncated: truncated)
            if words.isEmpty { scratch.signalContextUnread = true }
        }
        let unwinder = StackUnwinder(
            copy: interrupted, isText: isText, readWord: readWord, callTarget: callTarget, exactStart: exactStart,
            tailJumps: tailJumps, codeCache: codeCache, copyStack: copyStack, signalDepth: depth + 1)
        let frames = unwinder.unwind()
        if unwinder.wentBeyondCopy { scratch.wentBeyondCopy = true }
        if unwinder.signalContextUnread { scratch.signalContextUnread = true }
        return frames
    }

    /// Copies the stack from `sp` upward through the kernel (as much as a sample
    /// copies): the words, and whether the copy ends before the stack does.
    static func copyStack(from sp: UInt) -> (words: [UInt], truncated: Bool) {
        var words = [UInt](repeating: 0, count: StackSampler.kernelCopyBytes / MemoryLayout<UInt>.size)
        let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: sp, into: $0) }
        return (Array(words.prefix(copied)), copied == words.count)
    }
}
