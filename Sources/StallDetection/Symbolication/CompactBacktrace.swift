/// The Compact Backtrace Format (version 0, 64-bit): a header byte, then per frame
/// an instruction byte `0001axxx` (pc) or `0010axxx` (return address) followed by
/// `xxx + 1` big-endian bytes of the difference from the previous address
/// (sign-extended), starting from zero.
enum CompactBacktrace {
    /// Encodes addresses, the first as the interrupted instruction, the others as
    /// return addresses.
    static func encode(_ addresses: [UInt]) -> [UInt8] {
        encode(addresses.enumerated().map { (address: $0.element, isReturnAddress: $0.offset > 0) })
    }

    /// Encodes frames of either kind.
    static func encode(_ frames: [(address: UInt, isReturnAddress: Bool)]) -> [UInt8] {
        var bytes: [UInt8] = [0b0000_0010]  // version 0, 64-bit words
        var previous: UInt64 = 0
        for frame in frames {
            let delta = Int64(bitPattern: UInt64(frame.address) &- previous)
            previous = UInt64(frame.address)
            var length = 8
            while length > 1 {
                let shift = Int64(8 * (length - 1))
                let truncated = (delta << (64 - shift)) >> (64 - shift)  // sign-extend the low bytes
                if truncated != delta { break }
                length -= 1
            }
            let opcode: UInt8 = frame.isReturnAddress ? 0b0010_0000 : 0b0001_0000
            bytes.append(opcode | UInt8(length - 1))
            for byteIndex in stride(from: length - 1, through: 0, by: -1) {
                bytes.append(UInt8(truncatingIfNeeded: delta >> Int64(8 * byteIndex)))
            }
        }
        bytes.append(0)  // end
        return bytes
    }
}
