/// The bit stream of a DEFLATE block (RFC 1951 §3.1.1): bits packed into bytes
/// least significant first; Huffman codes go most significant bit first, so
/// they are written reversed.
///
/// A pure value.
struct DeflateBitWriter: Sendable {
    /// The whole bytes written so far (``finish()`` adds the last, partial one).
    private(set) var bytes: [UInt8] = []
    private var pending: UInt64 = 0
    private var pendingCount = 0

    init() {}

    /// Appends the low `count` bits of `value` (at most 32), least significant first:
    /// header fields and extra bits.
    mutating func write(_ value: UInt32, count: Int) {
        pending |= UInt64(value & (count == 32 ? .max : (1 << UInt32(count)) - 1)) << UInt64(pendingCount)
        pendingCount += count
        while pendingCount >= 8 {
            bytes.append(UInt8(truncatingIfNeeded: pending))
            pending >>= 8
            pendingCount -= 8
        }
    }

    /// Appends a Huffman code of `length` bits (at most 15), its most significant
    /// bit first.
    mutating func writeCode(_ code: UInt32, length: Int) {
        var reversed: UInt32 = 0
        for bit in 0..<length where code & (1 << UInt32(bit)) != 0 { reversed |= 1 << UInt32(length - 1 - bit) }
        write(reversed, count: length)
    }

    /// The stream, its last byte padded with zero bits.
    mutating func finish() -> [UInt8] {
        if pendingCount > 0 { write(0, count: 8 - pendingCount) }
        return bytes
    }
}
