/// The process's executable code as the unwinder needs it: the executable
/// mappings (`r-x`, never writable) sorted by start, those of files, and the main
/// executable's. A value taken from the symbolicator once per unwind, so that
/// unwinding takes no lock.
struct CodeRanges: Sendable {
    typealias Range = (start: UInt, end: UInt)

    /// Every executable mapping, sorted by start.
    let text: [Range]
    /// Executable mappings of files (not the vDSO or anonymous code).
    let fileText: [Range]
    /// The main executable's text, whose symbol table is complete.
    let executableText: [Range]

    /// The lowest and highest address of any executable mapping: most words of a
    /// stack (zeros, counts, flags) lie outside and are rejected at once, which
    /// matters to the unwinder's scans (every word of a stack copy is asked).
    private let lowest: UInt
    private let highest: UInt

    init(text: [Range], fileText: [Range], executableText: [Range]) {
        self.text = text
        self.fileText = fileText
        self.executableText = executableText
        lowest = text.first?.start ?? .max
        highest = text.map(\.end).max() ?? 0
    }

    /// Whether `address` lies in an executable mapping, with the 7 bytes before it
    /// (where the call instruction would be) in the same mapping.
    func isText(_ address: UInt) -> Bool {
        guard address >= lowest, address < highest else { return false }
        var low = 0
        var high = text.count
        while low < high {
            let middle = (low + high) / 2
            if text[middle].start <= address { low = middle + 1 } else { high = middle }
        }
        guard low > 0 else { return false }
        let range = text[low - 1]
        return address >= range.start + 8 && address < range.end
    }

    /// Whether `address` lies in an executable mapping of a file.
    func isFileBackedText(_ address: UInt) -> Bool {
        fileText.contains { address >= $0.start && address < $0.end }
    }

    /// Whether `address` lies in the main executable's text.
    func isInExecutable(_ address: UInt) -> Bool {
        executableText.contains { address >= $0.start && address < $0.end }
    }
}
