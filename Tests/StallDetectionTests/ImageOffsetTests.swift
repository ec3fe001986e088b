#if os(Linux)
import Foundation
import Glibc
import Testing

@testable import StallDetection

/// `StackFrame.imageOffset`: the address relative to its image's load address,
/// what offline symbolication needs, checked against `/proc/self/maps`.
@Suite("Image offsets")
struct ImageOffsetTests {
    /// The load address of the image holding `address`: the nearest mapping at
    /// file offset 0 of the same file below it. (`Runtime` also maps library files
    /// while it symbolicates, so the first such mapping in the list may be another.)
    static func loadAddress(of address: UInt) throws -> (UInt, String) {
        let maps = try #require(ProcFile.read("/proc/self/maps"))
        var lines: [(start: UInt, end: UInt, offset: String, path: String)] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            let bounds = fields.first?.split(separator: "-") ?? []
            guard fields.count >= 6, bounds.count == 2, let start = UInt(bounds[0], radix: 16),
                let end = UInt(bounds[1], radix: 16)
            else { continue }
            lines.append((start, end, String(fields[2]), String(fields[5])))
        }
        let holder = try #require(lines.first { address >= $0.start && address < $0.end })
        let base = try #require(
            lines.filter { $0.path == holder.path && $0.offset == "00000000" && $0.start <= holder.start }
                .max { $0.start < $1.start })
        return (base.start, holder.path)
    }

    @Test("a frame in libc carries its image's name and its offset from the load address")
    func libcOffset() throws {
        let address = try #require(dlsym(dlopen(nil, RTLD_NOW), "getpid")).map { UInt(bitPattern: $0) }!
        let (base, path) = try Self.loadAddress(of: address)
        let frames = Symbolicator().symbolicate([RawFrame(address: address, isUncertain: false)])
        let frame = try #require(frames.last)
        #expect(frame.address == address)
        #expect(frame.image.map { path.hasSuffix($0) } == true, "\(frame) in \(path)")
        #expect(frame.imageOffset == address - base, "\(frame): base 0x\(String(base, radix: 16))")
        #expect(frame.function?.contains("getpid") == true, "\(frame)")
    }

    @Test("symbolicators on several threads at once each name every frame")
    func concurrentSymbolication() async throws {
        let handle = dlopen(nil, RTLD_NOW)
        let names = ["getpid", "usleep", "nanosleep", "read", "write", "qsort"]
        // Inside each function (all but the first frame are read as return
        // addresses, named by the byte before them).
        let addresses = names.compactMap { name in dlsym(handle, name).map { UInt(bitPattern: $0) + 4 } }
        try #require(addresses.count == names.count)
        let unnamed = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    var misses = 0
                    for _ in 0..<20 {
                        let raw = addresses.map { RawFrame(address: $0, isUncertain: false) }
                        let frames = Symbolicator().symbolicate(raw)
                        misses += frames.filter { $0.function == nil }.count
                    }
                    return misses
                }
            }
            return await group.reduce(0, +)
        }
        #expect(unnamed == 0)
    }

    @Test("an unnamed frame prints its image and offset; an address in no image has neither")
    func unnamedFrame() {
        let named = StackFrame(
            address: 0x7f00_0000_1f2c, function: nil, file: nil, line: nil, image: "libfoo.so", isUncertain: false,
            imageOffset: 0x1f2c)
        #expect(named.description.hasSuffix("<unknown> (libfoo.so + 0x1f2c)"), "\(named)")
        let nowhere = Symbolicator().symbolicate([RawFrame(address: 0x10, isUncertain: true)])
        #expect(nowhere.count == 1 && nowhere[0].imageOffset == nil && nowhere[0].image == nil)
        #expect(nowhere[0].isUncertain)
    }
}
#endif
