/// The CRC-32 of ISO 3309 / ITU-T V.42 (polynomial 0x04C11DB7, reflected, as gzip,
/// zlib and PNG use it): `CRC32.checksum(Array("123456789".utf8)) == 0xCBF43926`.
///
/// Table-driven, a byte at a time. A pure value: ``update(_:)`` continues a
/// checksum over more bytes.
struct CRC32: Sendable {
    /// The checksum of the bytes given so far.
    private(set) var value: UInt32 = 0

    init() {}

    /// The checksum of `bytes`.
    static func checksum(_ bytes: [UInt8]) -> UInt32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }

    /// Continues the checksum over `bytes`.
    mutating func update(_ bytes: [UInt8]) {
        var crc = ~value
        for byte in bytes {
            crc = Self.table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8)
        }
        value = ~crc
    }

    /// The remainder of each byte value, reflected polynomial 0xEDB88320.
    private static let table: [UInt32] = (0..<256).map { index in
        var entry = UInt32(index)
        for _ in 0..<8 { entry = entry & 1 == 1 ? 0xEDB8_8320 ^ (entry >> 1) : entry >> 1 }
        return entry
    }
}
