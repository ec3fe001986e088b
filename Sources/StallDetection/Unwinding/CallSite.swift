/// Decoding the call instruction before a return address.
enum CallSite {
    enum Target {
        /// The call's target, resolved through a PLT or GOT slot where needed.
        case known(UInt)
        /// An indirect call through a register or memory that cannot be resolved.
        case unknown
        /// No call instruction precedes the address.
        case none
    }

    private enum Decoded {
        case direct(UInt)
        case memory(UInt)
        case indirect
        case none
    }

    /// Decodes the instruction before `address` from the 8 bytes before it, read
    /// through `readWord` (which cannot fault): code is never read directly, so a
    /// page that is unmapped or made unreadable while a sample is unwound (a JIT
    /// flipping its pages) makes a frame unprovable, never a crash.
    private static func decode(_ address: UInt, readWord: (UInt) -> UInt?) -> Decoded {
        #if arch(x86_64)
        guard address > 8, let word = readWord(address - 8) else { return .none }
        // code[k] is the byte at address - 7 + k (k = 0…6), little-endian.
        func code(_ k: Int) -> UInt8 { UInt8(truncatingIfNeeded: word >> UInt(8 * (k + 1))) }
        // A rel32 call's displacement is code[3…6]: the word's top four bytes.
        func displacement() -> Int32 { Int32(truncatingIfNeeded: word >> 32) }
        // call rel32: E8 xx xx xx xx
        if code(2) == 0xE8 {
            return .direct(UInt(bitPattern: Int(bitPattern: address) &+ Int(displacement())))
        }
        // call *disp32(%rip): FF 15 xx xx xx xx
        if code(1) == 0xFF && code(2) == 0x15 {
            return .memory(UInt(bitPattern: Int(bitPattern: address) &+ Int(displacement())))
        }
        // call r/m64: FF /2, with 2 to 7 bytes of operand encoding.
        for length in 2...7 {
            let opcodeIndex = 7 - length
            let modrm = code(opcodeIndex + 1)
            if code(opcodeIndex) == 0xFF && (modrm >> 3) & 0x7 == 2 { return .indirect }
        }
        return .none
        #elseif arch(arm64)
        guard address >= 8, address % 4 == 0, let word = readWord(address - 8) else { return .none }
        let instruction = UInt32(truncatingIfNeeded: word >> 32)
        if instruction & 0xFC00_0000 == 0x9400_0000 {  // BL imm26
            let offset = Int(Int32(bitPattern: instruction << 6) >> 6) * 4
            return .direct(UInt(bitPattern: Int(bitPattern: address - 4) &+ offset))
        }
        if instruction & 0xFFFF_FC1F == 0xD63F_0000 { return .indirect }  // BLR
        return .none
        #else
        return .indirect
        #endif
    }

    /// The target of the call before `returnAddress`, following a PLT stub
    /// (`jmp *slot(%rip)`, after an optional `endbr64` and `bnd`) to its GOT slot.
    static func target(ofCallBefore returnAddress: UInt, readWord: (UInt) -> UInt?) -> Target {
        switch decode(returnAddress, readWord: readWord) {
        case .none: return .none
        case .indirect: return .unknown
        case .memory(let slot):
            guard let target = readWord(slot) else { return .unknown }
            return .known(target)
        case .direct(let target):
            #if arch(x86_64)
            if let resolved = resolvePLT(target, readWord: readWord) { return .known(resolved) }
            #endif
            return .known(target)
        }
    }

    /// The size of a PLT stub (x86-64 and AArch64 alike).
    static let pltStubSize: UInt = 16

    /// The PLT stub the call before `returnAddress` goes through, when it calls
    /// one (x86-64); nil for any other call.
    static func pltStub(ofCallBefore returnAddress: UInt, readWord: (UInt) -> UInt?) -> UInt? {
        #if arch(x86_64)
        guard case .direct(let target) = decode(returnAddress, readWord: readWord),
            resolvePLT(target, readWord: readWord) != nil
        else { return nil }
        return target
        #else
        return nil
        #endif
    }

    /// The jumps at the start of a function: where a wrapper or thunk goes on
    /// with a tail call.
    struct TailJumps: Equatable {
        /// Destinations of direct jumps and of jumps through a PLT stub or a GOT
        /// slot, resolved.
        var targets: [UInt] = []
        /// Whether a jump through a register or a register-relative slot (a
        /// method dispatch thunk's `jmp *0x68(%rax)`) is there.
        var indirect = false
    }

    /// Where the return address of a function interrupted at `pc` lies, in words
    /// above the stack pointer, when the instruction at `pc` shows that the
    /// function has no frame record yet or no longer has one (x86-64): at its
    /// entry (`endbr64`, `push %rbp`) or at a `ret`, the return address is the
    /// word at the stack pointer; at `mov %rsp,%rbp` right after `push %rbp`, it
    /// is the word above. Nil elsewhere (the function's record is in place, or it
    /// keeps none and its caller's frame must be proven by its call). Bytes are
    /// read through `readWord`, so unmapped code yields nil.
    static func returnAddressSlot(interruptedAt pc: UInt, readWord: (UInt) -> UInt?) -> Int? {
        #if arch(x86_64)
        // byte(0) is the byte at pc - 1; the instruction at pc starts at byte(1).
        let word = pc > 0 ? readWord(pc - 1) : nil
        guard let word = word ?? readWord(pc).map({ $0 << 8 }) else { return nil }
        func byte(_ k: Int) -> UInt8 { UInt8(truncatingIfNeeded: word >> UInt(8 * k)) }
        switch byte(1) {
        case 0x55, 0xC3: return 0  // push %rbp; ret
        case 0xF3:
            // endbr64 (F3 0F 1E FA) at an entry; rep ret (F3 C3)
            if byte(2) == 0xC3 || (byte(2) == 0x0F && byte(3) == 0x1E && byte(4) == 0xFA) { return 0 }
            return nil
        case 0x48:
            // mov %rsp,%rbp (48 89 E5) right after push %rbp (55)
            return byte(0) == 0x55 && byte(2) == 0x89 && byte(3) == 0xE5 ? 1 : nil
        default:
            return nil
        }
        #else
        return nil
        #endif
    }

    /// The jumps in the first 256 bytes of the code at `function` (x86-64): every
    /// `jmp rel32` (`E9`), `jmp *disp32(%rip)` (`FF 25`) and other `jmp r/m64`
    /// (`FF /4`) at any offset. Bytes are read through `readWord`, so code that
    /// is not mapped yields nothing; a byte pattern inside another instruction may
    /// add a stray destination, which counts only if it leads to the frame being
    /// proven.
    static func tailJumps(from function: UInt, readWord: (UInt) -> UInt?) -> TailJumps {
        #if arch(x86_64)
        let bytes = codeBytes(at: function, words: 32, readWord: readWord)
        func displacement(at index: Int) -> Int { Int(littleEndianInt32(bytes, at: index)) }
        var found = TailJumps()
        for index in bytes.indices {
            if bytes[index] == 0xE9, index + 5 <= bytes.count {
                let destination = UInt(
                    bitPattern: Int(bitPattern: function) &+ index &+ 5 &+ displacement(at: index + 1))
                found.targets.append(resolvePLT(destination, readWord: readWord) ?? destination)
            } else if bytes[index] == 0xFF, index + 1 < bytes.count, (bytes[index + 1] >> 3) & 0x7 == 4 {
                if bytes[index + 1] == 0x25 {
                    guard index + 6 <= bytes.count else { continue }
                    let slot = UInt(bitPattern: Int(bitPattern: function) &+ index &+ 6 &+ displacement(at: index + 2))
                    if let destination = readWord(slot) { found.targets.append(destination) }
                } else {
                    found.indirect = true
                }
            }
        }
        return found
        #else
        return TailJumps()
        #endif
    }

    /// Where the PLT stub at `stub` jumps: the function its GOT slot holds; nil
    /// for anything else (the PLT's first entry, other code) and off x86-64.
    static func pltTarget(ofStub stub: UInt, readWord: (UInt) -> UInt?) -> UInt? {
        #if arch(x86_64)
        return resolvePLT(stub, readWord: readWord)
        #else
        return nil
        #endif
    }

    #if arch(x86_64)
    private static func resolvePLT(_ stub: UInt, readWord: (UInt) -> UInt?) -> UInt? {
        let bytes = codeBytes(at: stub, words: 2, readWord: readWord)
        guard bytes.count == 16 else { return nil }
        var index = 0
        if bytes[0] == 0xF3 && bytes[1] == 0x0F && bytes[2] == 0x1E && bytes[3] == 0xFA { index = 4 }  // endbr64
        if bytes[index] == 0xF2 { index += 1 }  // bnd
        guard bytes[index] == 0xFF, bytes[index + 1] == 0x25 else { return nil }
        let displacement = littleEndianInt32(bytes, at: index + 2)
        let next = Int(bitPattern: stub) + index + 6
        return readWord(UInt(bitPattern: next &+ Int(displacement)))
    }

    /// The bytes of up to `words` words of code from `address`, in memory order
    /// (fewer when a word cannot be read).
    private static func codeBytes(at address: UInt, words: Int, readWord: (UInt) -> UInt?) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(words * 8)
        for index in 0..<words {
            guard let word = readWord(address &+ UInt(index * 8)) else { break }
            for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt(shift))) }
        }
        return bytes
    }

    /// The little-endian 32-bit value at `bytes[index…index + 3]`.
    private static func littleEndianInt32(_ bytes: [UInt8], at index: Int) -> Int32 {
        Int32(
            bitPattern: UInt32(bytes[index]) | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2]) << 16
                | UInt32(bytes[index + 3]) << 24)
    }
    #endif
}
