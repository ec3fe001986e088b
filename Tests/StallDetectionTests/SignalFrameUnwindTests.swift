import Testing

@testable import StallDetection

#if os(Linux) && arch(x86_64)

/// The unwinder through a signal frame, over synthetic stacks: text is
/// [0x1000_0000, 0x2000_0000), the signal return trampoline's code (`mov $15,
/// %rax; syscall`) lies at ``restorer``, and a return address's call target is
/// given by a table.
@Suite("Stack unwinding through a signal frame (synthetic stacks)")
struct SignalFrameUnwindTests {
    static let sp: UInt = 0x7000_0000
    static let restorer: UInt = 0x1800_0000
    static func isText(_ address: UInt) -> Bool { address >= 0x1000_0000 && address < 0x2000_0000 }

    /// The trampoline's bytes, read word by word at any address (the rest of text is zeros).
    static func readCode(_ address: UInt) -> UInt? {
        let code: [UInt8] = [0x48, 0xC7, 0xC0, 0x0F, 0x00, 0x00, 0x00, 0x0F, 0x05]
        var word: UInt = 0
        for byte in 0..<8 {
            let offset = Int(bitPattern: address &+ UInt(byte) &- restorer)
            let value = offset >= 0 && offset < code.count ? code[offset] : 0
            word |= UInt(value) << UInt(8 * byte)
        }
        return isText(address) ? word : nil
    }

    func unwind(_ words: [UInt], pc: UInt, fp: UInt?, calls: [UInt: CallSite.Target]) -> [RawFrame] {
        let copy = StackCopy(pc: pc, sp: Self.sp, fp: fp, words: words, truncated: false)
        return StackUnwinder(
            copy: copy, isText: Self.isText, readWord: Self.readCode, callTarget: { calls[$0] ?? .none },
            tailJumps: { _ in CallSite.TailJumps() }, copyStack: { _ in ([], false) }
        ).unwind()
    }

    /// A kernel signal frame at `slot`: the trampoline, then a `ucontext_t` with
    /// the interrupted `rip`, `rsp` and `rbp`; the rest of the frame holds `filler`.
    func signalFrame(into words: inout [UInt], at slot: Int, rip: UInt, rsp: UInt, rbp: UInt, filler: UInt) {
        for index in slot..<(slot + 60) { words[index] = filler }
        words[slot] = Self.restorer
        words[slot + 1] = 7  // uc_flags
        words[slot + 2] = 0  // uc_link
        words[slot + 16] = rbp
        words[slot + 21] = rsp
        words[slot + 22] = rip
        words[slot + 29] = Self.sp + UInt(slot + 40) * 8  // fpregs, above the frame
    }

    /// The interrupted code from slot 64: a frameless leaf's return address into
    /// C (at 0x1200_0000), then three records returning into 0x1300_0000,
    /// 0x1400_0000, 0x1500_0000.
    func interruptedStack(into words: inout [UInt]) -> [UInt: CallSite.Target] {
        words[64] = 0x1200_0020
        words[65] = Self.sp + 67 * 8
        words[66] = 0x1300_0040
        words[67] = Self.sp + 69 * 8
        words[68] = 0x1400_0050
        words[69] = 0
        words[70] = 0x1500_0060
        return [
            0x1200_0020: .known(0x1100_0000), 0x1300_0040: .known(0x1200_0000), 0x1400_0050: .known(0x1300_0000),
            0x1500_0060: .known(0x1400_0000),
            // A stale return address (the signal frame's filler), whose call reaches the handler.
            0x1000_5005: .known(0x1600_0000),
        ]
    }

    @Test(
        "a handler's record returning to the trampoline: the unwind goes on from the saved registers, and nothing in the kernel's frame becomes a frame"
    )
    func throughSignalFrame() {
        var words = [UInt](repeating: 0, count: 80)
        let calls = interruptedStack(into: &words)
        // The handler's record at slot 0 (its saved rbp is the interrupted one).
        words[0] = Self.sp + 65 * 8
        signalFrame(
            into: &words, at: 1, rip: 0x1100_0010, rsp: Self.sp + 64 * 8, rbp: Self.sp + 65 * 8, filler: 0x1000_5005)
        let frames = unwind(words, pc: 0x1600_0010, fp: Self.sp, calls: calls)
        #expect(
            frames.map(\.address) == [
                0x1600_0010, Self.restorer, 0x1100_0010, 0x1200_0020, 0x1300_0040, 0x1400_0050, 0x1500_0060,
            ], "\(frames)")
        #expect(frames[1].isSignalReturn && !frames.contains { $0.isUncertain })
    }

    @Test("a stale signal frame in a sleeping thread's locals, below no installed handler, is not followed")
    func staleSignalFrameIgnored() {
        var words = [UInt](repeating: 0, count: 80)
        let calls = interruptedStack(into: &words)
        // A sleeping leaf (no frame pointer) at 0x1100_0010 whose locals hold an
        // old signal frame pointing into the live stack.
        signalFrame(
            into: &words, at: 2, rip: 0x1300_0010, rsp: Self.sp + 66 * 8, rbp: Self.sp + 67 * 8, filler: 0)
        words[0] = 0x1200_0020
        words[1] = 0
        // The live chain: slot 0 is the leaf's return address; the record of C at 65.
        let frames = unwind(words, pc: 0x1100_0010, fp: nil, calls: calls)
        #expect(!frames.contains { $0.address == Self.restorer || $0.isSignalReturn }, "\(frames)")
        #expect(
            frames.filter { !$0.isUncertain }.map(\.address) == [
                0x1100_0010, 0x1200_0020, 0x1300_0040, 0x1400_0050, 0x1500_0060,
            ], "\(frames)")
    }
}

#endif
