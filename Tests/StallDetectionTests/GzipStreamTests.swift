import Foundation
import Testing

@testable import StallDetection

/// The pieces of the pprof export's file format, against outside references:
/// CRC-32 check values, protocol buffer varints as the format's documentation
/// spells them, and gzip streams read back by the system's `gzip -dc`.
@Suite("gzip, CRC-32 and protobuf wire format")
struct GzipStreamTests {
    @Test("CRC-32 gives the published check values")
    func crc32KnownVectors() {
        #expect(CRC32.checksum([]) == 0)
        #expect(CRC32.checksum(Array("a".utf8)) == 0xE8B7_BE43)
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum(Array("The quick brown fox jumps over the lazy dog".utf8)) == 0x414F_A339)
        var split = CRC32()
        split.update(Array("1234".utf8))
        split.update(Array("56789".utf8))
        #expect(split.value == 0xCBF4_3926, "a checksum continued over two parts equals the whole one")
    }

    @Test("varints: 7 bits a byte, least significant first; a negative int64 takes ten bytes")
    func varints() {
        func encoded(_ value: UInt64) -> [UInt8] {
            var writer = ProtobufWriter()
            writer.rawVarint(value)
            return writer.bytes
        }
        #expect(encoded(0) == [0])
        #expect(encoded(1) == [1])
        #expect(encoded(127) == [0x7F])
        #expect(encoded(150) == [0x96, 0x01])
        #expect(encoded(300) == [0xAC, 0x02])
        #expect(encoded(UInt64.max) == Array(repeating: 0xFF, count: 9) + [0x01])
        var writer = ProtobufWriter()
        writer.varint(field: 1, Int64(-1))
        #expect(writer.bytes == [0x08] + Array(repeating: 0xFF, count: 9) + [0x01])
    }

    @Test("fields: key = number << 3 | wire type; strings and packed lists are length-delimited")
    func fields() {
        var writer = ProtobufWriter()
        writer.varint(field: 1, UInt64(150))
        writer.string(field: 2, "testing")
        writer.packedVarints(field: 4, [UInt64(3), 270, 86942])
        writer.packedVarints(field: 5, [UInt64]())
        writer.message(field: 3) { $0.varint(field: 1, UInt64(150)) }
        #expect(
            writer.bytes == [0x08, 0x96, 0x01] + [0x12, 0x07] + Array("testing".utf8)
                + [0x22, 0x06, 0x03, 0x8E, 0x02, 0x9E, 0xA7, 0x05] + [0x1A, 0x03, 0x08, 0x96, 0x01])
    }

    @Test("gzip -dc reads back every stream: empty, short, repetitive, random, longer than the window")
    func gzipRoundTrip() throws {
        var generator = SystemRandomNumberGenerator()
        let random = (0..<5_000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let names = (0..<3_000).map { "Module.function\($0 % 37)(argument:) -> Swift.Int\n" }.joined()
        let inputs: [[UInt8]] = [
            [], [0x41], Array("abcabcabcabcabcabc".utf8), Array(repeating: 0, count: 100_000), random,
            Array(names.utf8), random + Array(names.utf8) + random,
        ]
        for input in inputs {
            let compressed = Gzip.compress(input)
            #expect(Array(compressed.prefix(3)) == [0x1F, 0x8B, 8])
            #expect(try Self.gunzip(compressed) == input, "\(input.count) bytes")
        }
        let repetitive = Gzip.compress(Array(names.utf8))
        #expect(repetitive.count * 10 < names.utf8.count, "\(repetitive.count) of \(names.utf8.count) bytes")
    }

    @Test("the gzip trailer holds the CRC-32 and the size of the input, little-endian")
    func gzipTrailer() {
        let input = Array("123456789".utf8)
        let compressed = Gzip.compress(input)
        #expect(Array(compressed.suffix(8)) == [0x26, 0x39, 0xF4, 0xCB, 9, 0, 0, 0])
    }

    /// `bytes` through the system's `gzip -dc`.
    static func gunzip(_ bytes: [UInt8]) throws -> [UInt8] {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("gzip-\(UUID().uuidString).gz").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["gzip", "-dc", path]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw GunzipFailed(status: process.terminationStatus) }
        return Array(data)
    }

    struct GunzipFailed: Error {
        var status: Int32
    }
}
