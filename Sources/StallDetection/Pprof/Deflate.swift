/// A DEFLATE compressor (RFC 1951): one final block with the fixed Huffman codes
/// (§3.2.6) over LZ77 matches, found greedily with a hash of three bytes and a
/// chain of at most ``maximumChainLength`` earlier positions in the 32 KB window.
///
/// Fixed codes need no code tables in the stream, which keeps this short; they
/// compress less than the dynamic codes of `gzip -6`: a stall's pprof profile
/// of 2.3–2.8 KB comes out at 60–62 % of its size, about 10 % larger than
/// `gzip -6` makes it. Any inflater reads it.
///
/// - Complexity: O(n × ``maximumChainLength``) for n bytes.
enum Deflate {
    /// How many earlier positions with the same three bytes are tried per match.
    static let maximumChainLength = 32
    static let windowSize = 32_768
    static let minimumMatch = 3
    static let maximumMatch = 258

    /// `input` as one DEFLATE stream.
    static func compress(_ input: [UInt8]) -> [UInt8] {
        var writer = DeflateBitWriter()
        writer.write(1, count: 1)  // BFINAL: the last block
        writer.write(1, count: 2)  // BTYPE 01: fixed Huffman codes
        var finder = MatchFinder(input: input)
        var position = 0
        while position < input.count {
            if let match = finder.longestMatch(at: position) {
                writeLength(match.length, to: &writer)
                writeDistance(match.distance, to: &writer)
                for skipped in position..<(position + match.length) { finder.insert(skipped) }
                position += match.length
            } else {
                writeLiteral(Int(input[position]), to: &writer)
                finder.insert(position)
                position += 1
            }
        }
        writeLiteral(256, to: &writer)  // end of block
        return writer.finish()
    }

    /// A literal/length symbol (0…287) in the fixed code.
    private static func writeLiteral(_ symbol: Int, to writer: inout DeflateBitWriter) {
        switch symbol {
        case 0...143: writer.writeCode(UInt32(0x30 + symbol), length: 8)
        case 144...255: writer.writeCode(UInt32(0x190 + symbol - 144), length: 9)
        case 256...279: writer.writeCode(UInt32(symbol - 256), length: 7)
        default: writer.writeCode(UInt32(0xC0 + symbol - 280), length: 8)
        }
    }

    private static let lengthBases: [Int] = [
        3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227,
        258,
    ]
    private static let lengthExtraBits: [Int] = [
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
    ]
    private static let distanceBases: [Int] = [
        1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097,
        6145, 8193, 12289, 16385, 24577,
    ]

    /// A match length (3…258): its symbol (257…285), then its extra bits.
    private static func writeLength(_ length: Int, to writer: inout DeflateBitWriter) {
        let index = lengthBases.lastIndex { $0 <= length } ?? 0
        writeLiteral(257 + index, to: &writer)
        writer.write(UInt32(length - lengthBases[index]), count: lengthExtraBits[index])
    }

    /// A distance (1…32768): its five-bit code, then its extra bits.
    private static func writeDistance(_ distance: Int, to writer: inout DeflateBitWriter) {
        let index = distanceBases.lastIndex { $0 <= distance } ?? 0
        writer.writeCode(UInt32(index), length: 5)
        writer.write(UInt32(distance - distanceBases[index]), count: max(0, index / 2 - 1))
    }
}

/// Finds earlier occurrences of the bytes at a position: the latest position of
/// each hash of three bytes, and for each position the one before it with the
/// same hash.
private struct MatchFinder {
    let input: [UInt8]
    private var head: [Int]
    private var previous: [Int]
    private static let hashBits = 15

    init(input: [UInt8]) {
        self.input = input
        head = Array(repeating: -1, count: 1 << Self.hashBits)
        previous = Array(repeating: -1, count: Deflate.windowSize)
    }

    private func hash(at position: Int) -> Int {
        let value = Int(input[position]) << 16 | Int(input[position + 1]) << 8 | Int(input[position + 2])
        return (value &* 2_654_435_761) >> (32 - Self.hashBits) & ((1 << Self.hashBits) - 1)
    }

    /// Records `position` as the latest with its three bytes.
    mutating func insert(_ position: Int) {
        guard position + Deflate.minimumMatch <= input.count else { return }
        let key = hash(at: position)
        previous[position % Deflate.windowSize] = head[key]
        head[key] = position
    }

    /// The longest earlier match of at least three bytes within the window, or nil.
    func longestMatch(at position: Int) -> (length: Int, distance: Int)? {
        guard position + Deflate.minimumMatch <= input.count else { return nil }
        let limit = min(Deflate.maximumMatch, input.count - position)
        var candidate = head[hash(at: position)]
        var best: (length: Int, distance: Int)?
        var tried = 0
        while candidate >= 0, position - candidate <= Deflate.windowSize, tried < Deflate.maximumChainLength {
            var length = 0
            while length < limit && input[candidate + length] == input[position + length] { length += 1 }
            if length >= Deflate.minimumMatch && length > (best?.length ?? 0) {
                best = (length, position - candidate)
                if length == limit { break }
            }
            let next = previous[candidate % Deflate.windowSize]
            // An entry overwritten by a later position is no longer a predecessor.
            guard next < candidate else { break }
            candidate = next
            tried += 1
        }
        return best
    }
}
