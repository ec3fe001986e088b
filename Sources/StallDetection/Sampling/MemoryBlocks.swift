/// Words of this process' memory read through the kernel (``StackSampler/copyMemory(from:into:)``,
/// which cannot fault), one aligned block of ``blockWords`` words per system call,
/// remembered for one unwind: decoding a wrapper's tail jumps reads its first 32
/// words, and word-by-word reads were about 370 system calls (200 µs) per sample
/// of a thread asleep in the kernel. A block never crosses a page, so it is either
/// wholly readable or not at all. Kept for one unwind only: stacks and GOT slots
/// change between samples, and a page mapped now may be gone by the next.
final class MemoryBlocks {
    /// Words a block holds: 32 for stacks and code (a page's worth would copy
    /// far more than an unwind reads), 512 (a page) for async contexts, which
    /// the task allocator packs next to each other.
    let blockWords: Int
    private var blocks: [UInt: [UInt]?] = [:]
    /// System calls made (tests).
    private(set) var reads = 0

    init(blockWords: Int = 32) {
        precondition(blockWords > 0 && blockWords & (blockWords - 1) == 0 && blockWords <= 512)
        self.blockWords = blockWords
    }

    /// The word at `address` (any alignment: a function may start anywhere), nil
    /// where any of its bytes is unreadable.
    func word(at address: UInt) -> UInt? {
        let wordSize = UInt(MemoryLayout<UInt>.size)
        let offset = address % wordSize
        if offset == 0 { return alignedWord(at: address) }
        let low = address - offset
        guard low <= UInt.max - 2 * wordSize, let first = alignedWord(at: low),
            let second = alignedWord(at: low + wordSize)
        else { return nil }
        // Little-endian (x86-64, arm64): the bytes from `offset` on, then the next word's.
        let shift = offset * 8
        return first >> shift | second << (UInt(UInt.bitWidth) - shift)
    }

    private func alignedWord(at address: UInt) -> UInt? {
        let wordSize = UInt(MemoryLayout<UInt>.size)
        let blockBytes = UInt(blockWords) * wordSize
        let base = address & ~(blockBytes - 1)
        let block: [UInt]?
        if let known = blocks[base] {
            block = known
        } else {
            reads += 1
            var words = [UInt](repeating: 0, count: blockWords)
            let copied = words.withUnsafeMutableBytes { StackSampler.copyMemory(from: base, into: $0) }
            block = copied == blockWords ? words : nil
            blocks[base] = .some(block)
        }
        return block?[Int((address - base) / wordSize)]
    }
}
