/// The gzip file format (RFC 1952) around a ``Deflate`` stream: what pprof
/// readers expect of a `.pb.gz` file, and what `gzip -dc` reads.
///
/// The header has no file name, no modification time (0) and OS 255 (unknown);
/// the trailer is the CRC-32 of the input and its size modulo 2³², both
/// little-endian.
enum Gzip {
    /// `input` compressed as one gzip member.
    static func compress(_ input: [UInt8]) -> [UInt8] {
        var output: [UInt8] = [
            0x1F, 0x8B,  // magic
            8,  // CM: deflate
            0,  // FLG: no extra fields
            0, 0, 0, 0,  // MTIME: none
            0,  // XFL
            255,  // OS: unknown
        ]
        output += Deflate.compress(input)
        output += littleEndian(CRC32.checksum(input))
        output += littleEndian(UInt32(truncatingIfNeeded: input.count))
        return output
    }

    private static func littleEndian(_ value: UInt32) -> [UInt8] {
        (0..<4).map { UInt8(truncatingIfNeeded: value >> (8 * UInt32($0))) }
    }
}
