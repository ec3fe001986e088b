import CStallCapture
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `stallcapture_copy_memory`, the signal handler's copy of the sampled thread's
/// memory: exact up to the first unreadable byte, never a fault, and correct when
/// more handlers copy at once than there are pipes.
@Suite("Copies of the process' memory in the signal handler")
struct MemoryCopyTests {
    #if os(Linux)
    private static let page = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// `pages` pages mapped readable and writable, each byte its offset's low byte.
    private static func mapping(pages: Int) -> UnsafeMutableRawPointer {
        let base = mmap(nil, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)!
        for offset in 0..<(pages * page) {
            base.storeBytes(of: UInt8(truncatingIfNeeded: offset), toByteOffset: offset, as: UInt8.self)
        }
        return base
    }

    /// The pipes the handler copies through, open (as a detector's start opens them).
    private static let pipes = stallcapture_copy_pipes_open()

    private static func copy(_ address: UnsafeMutableRawPointer, _ size: Int) -> (bytes: [UInt8], error: Int32) {
        var bytes = [UInt8](repeating: 0xEE, count: size)
        var error: Int32 = 0
        let copied = bytes.withUnsafeMutableBytes {
            stallcapture_copy_memory($0.baseAddress, UInt(bitPattern: address), size, &error)
        }
        return (Array(bytes.prefix(copied)), error)
    }

    /// Whether `bytes` are those of `mapping` from `offset`.
    private static func matches(_ bytes: [UInt8], from offset: Int) -> Bool {
        bytes.enumerated().allSatisfy { $0.element == UInt8(truncatingIfNeeded: offset + $0.offset) }
    }

    @Test("a readable range is copied whole, from any offset in a page, in one or many pipe-fulls")
    func readableRange() {
        #expect(Self.pipes > 0, "the copy pipes could not be opened")
        let base = Self.mapping(pages: 200)
        defer { munmap(base, 200 * Self.page) }
        for (offset, size) in [(0, 1), (100, 8), (Self.page - 3, 9), (77, 150 * Self.page), (5, 199 * Self.page)] {
            let (bytes, error) = Self.copy(base + offset, size)
            #expect(bytes.count == size && error == 0, "offset \(offset), size \(size): \(bytes.count), errno \(error)")
            #expect(Self.matches(bytes, from: offset), "offset \(offset), size \(size)")
        }
    }

    @Test(
        "a copy stops exactly before a page that cannot be read: PROT_NONE, unmapped, a guard region",
        arguments: ["protNone", "unmapped", "guard"])
    func stopsBeforeUnreadablePage(kind: String) {
        let base = Self.mapping(pages: 16)
        defer { munmap(base, 16 * Self.page) }
        let hole = base + 8 * Self.page
        switch kind {
        case "protNone": #expect(mprotect(hole, Self.page, PROT_NONE) == 0)
        case "unmapped": #expect(munmap(hole, Self.page) == 0)
        default:
            // MADV_GUARD_INSTALL (Linux 6.13): a kernel without it has nothing to test.
            guard madvise(hole, Self.page, 102) == 0 else { return }
        }
        let start = 3 * Self.page + 123
        let (bytes, error) = Self.copy(base + start, 10 * Self.page)
        #expect(bytes.count == 8 * Self.page - start && error == 0, "\(kind): \(bytes.count) bytes, errno \(error)")
        #expect(Self.matches(bytes, from: start))
        let (inside, insideError) = Self.copy(hole + 16, 64)
        #expect(inside.isEmpty && insideError == EFAULT, "\(kind): \(inside.count) bytes, errno \(insideError)")
        #expect(Self.copy(hole - 8, 64).bytes.count == 8, "\(kind): the readable head of a range")
    }

    @Test("32 threads copying at once, four times as many as the pipes: every copy is its own memory")
    func concurrentCopies() async {
        let base = Self.mapping(pages: 64)
        defer { munmap(base, 64 * Self.page) }
        let address = UInt(bitPattern: base)
        let wrong = await withTaskGroup(of: Int.self) { group in
            for thread in 0..<32 {
                group.addTask {
                    var wrong = 0
                    for round in 0..<200 {
                        let offset = (thread * 977 + round * 131) % (32 * Self.page)
                        let pointer = UnsafeMutableRawPointer(bitPattern: address + UInt(offset))!
                        let (bytes, error) = Self.copy(pointer, 2 * Self.page + round)
                        if bytes.count != 2 * Self.page + round || error != 0 || !Self.matches(bytes, from: offset) {
                            wrong += 1
                        }
                    }
                    return wrong
                }
            }
            return await group.reduce(0, +)
        }
        #expect(wrong == 0, "\(wrong) of 6,400 copies were short or held other bytes")
    }

    @Test("one taken pipe serves a sample's run of copies; with every pipe taken, copies still come exact")
    func takenPipe() {
        let base = Self.mapping(pages: 8)
        defer { munmap(base, 8 * Self.page) }
        func copied(through taken: Int32, offset: Int, size: Int) -> Bool {
            var bytes = [UInt8](repeating: 0xEE, count: size)
            var error: Int32 = 0
            let count = bytes.withUnsafeMutableBytes {
                stallcapture_copy_memory_with(taken, $0.baseAddress, UInt(bitPattern: base + offset), size, &error)
            }
            return count == size && error == 0 && Self.matches(bytes, from: offset)
        }
        // A pipe free: the 32 copiers of `concurrentCopies` (run beside this
        // test) and other tests' detectors take them for microseconds at a time.
        func freePipe() -> Int32 {
            for _ in 0..<100_000 {
                let taken = stallcapture_copy_begin()
                if taken >= 0 { return taken }
                usleep(100)
            }
            return -1
        }
        // As the handler does: two words, then a stack's worth, through one pipe.
        let first = freePipe()
        #expect(first >= 0, "no pipe was free for 10 s")
        #expect(copied(through: first, offset: 40, size: 8) && copied(through: first, offset: 900, size: 8))
        #expect(copied(through: first, offset: 100, size: 6 * Self.page))
        // Take the rest (other tests' detectors may hold some): a taken pipe is
        // never handed out twice, and a copy with none free goes through the kernel.
        var taken = [first]
        while taken.count <= 8 {
            let next = stallcapture_copy_begin()
            guard next >= 0 else { break }
            #expect(!taken.contains(next), "pipe \(next) handed out while taken")
            taken.append(next)
        }
        let before = stallcapture_copies_without_pipe()
        #expect(copied(through: -1, offset: 3, size: 3 * Self.page))
        #expect(stallcapture_copies_without_pipe() > before)
        for pipe in taken { stallcapture_copy_end(pipe) }
        let again = freePipe()
        #expect(again >= 0 && copied(through: again, offset: 7, size: 2 * Self.page))
        stallcapture_copy_end(again)
    }
    #endif
}
