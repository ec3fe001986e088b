import Foundation
import Testing

@testable import StallDetection

#if canImport(Glibc)
import Glibc

/// A directory entry's name is read in place, never past the entry: `readdir`
/// returns records as long as their names, and the last one can end where the
/// memory after it is not readable (a crash in CI, reading a fatal report's
/// directory, came from copying the whole 256-byte `d_name` field).
@Suite("Directory entry names")
struct DirectoryEntryNameTests {
    @Test("an entry that ends right before an unreadable page is named without reading past it")
    func entryAtTheEndOfReadableMemory() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let memory = try #require(
            mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), "mmap")
        #expect(memory != MAP_FAILED)
        defer { munmap(memory, 2 * page) }
        #expect(mprotect(memory + page, page, PROT_NONE) == 0)
        let name = Array("report.json".utf8) + [0]
        let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 0
        // The record (its header, its name and the zero) ends on the page's last byte.
        let start = memory + page - offset - name.count
        let entry = start.bindMemory(to: dirent.self, capacity: 1)
        for (index, byte) in name.enumerated() { (start + offset + index).storeBytes(of: byte, as: UInt8.self) }
        #expect(ProcessFacts.entryName(entry) == "report.json")
    }

    @Test("every thread of this process is listed with its id")
    func threadsAreListed() {
        let threads = ProcessFacts.threads()
        #expect(threads.contains { $0.id == getpid() })
    }
}
#endif
