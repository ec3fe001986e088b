import CStallCapture
import Foundation
import Testing

@testable import StallDetection

@Suite("ELF symbol tables: function starts without symbolicating, and the vDSO's names")
struct ElfSymbolTableTests {
    #if os(Linux)
    @Test("the executable's table gives the same function start as the symbolicator, for code anywhere in it")
    func executableStartsMatchTheSymbolicator() throws {
        let table = try #require(ElfSymbolTable.executable)
        #expect(table.functions.count > 100)
        let symbolicator = Symbolicator()
        let function = unsafeBitCast(
            stallcapture_current_queue as @convention(c) () -> UInt, to: UInt.self)
        let found = try #require(table.function(containing: function + 2))
        #expect(found.start == function)
        // Every 97th function of the table, looked up one byte in.
        var compared = 0
        for entry in stride(from: 0, to: table.functions.count, by: 97) {
            let start = table.functions[entry].start
            guard table.functions[entry].size > 1,
                let named = symbolicator.functionStart(of: start + 1, isReturnAddress: false)
            else { continue }
            #expect(table.function(containing: start + 1)?.start == named, "function at \(start)")
            compared += 1
        }
        #expect(compared > 10)
    }

    @Test(
        "a call from the executable into the Swift runtime must reach the very function the frame lies in; from a library, any near one may"
    )
    func exactStartsOfLibraryFunctions() throws {
        let ranges = Symbolicator.shared.code
        let slowAlloc = try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_slowAlloc")).address
        let release = try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_release")).address
        let inExecutable = unsafeBitCast(stallcapture_current_queue as @convention(c) () -> UInt, to: UInt.self)
        try #require(ranges.isInExecutable(inExecutable) && !ranges.isInExecutable(slowAlloc))
        func start(of inner: UInt, from candidate: UInt) -> UInt? {
            SamplingContext.exactStart(
                of: inner, isReturnAddress: true, calledFrom: candidate, ranges: ranges,
                executableStart: { _, _ in nil }, libraryStart: { ElfSymbolTable.function(at: $0)?.start })
        }
        // A return address 8 bytes into `swift_slowAlloc`: its own start, never
        // `swift_release`'s, however near.
        #expect(start(of: slowAlloc + 8, from: inExecutable + 1) == slowAlloc)
        #expect(start(of: release + 8, from: inExecutable + 1) == release)
        #expect(start(of: slowAlloc + 8, from: release + 8) == nil, "a caller in a library: tail calls may lie between")
    }

    @Test("an address outside every function of the executable has none")
    func addressesOutsideHaveNone() throws {
        let table = try #require(ElfSymbolTable.executable)
        #expect(table.function(containing: 0x10) == nil)
        var local = 0
        let stackAddress = withUnsafeMutablePointer(to: &local) { UInt(bitPattern: $0) }
        #expect(table.function(containing: stackAddress) == nil)
    }

    @Test("the vDSO's functions are named as a debugger names them")
    func vdsoNames() throws {
        let table = try #require(ElfSymbolTable.vdso)
        let names = Set(table.functions.compactMap(\.name))
        #expect(names.contains("clock_gettime"), "\(names.sorted())")
        #expect(!names.contains("__vdso_clock_gettime"))
        #expect(table.imageName == "[vdso]")
    }
    #endif
}

#if os(Linux)
@Suite("Naming that fails is tried again")
struct NamingFailureTests {
    @Test("an address a symbol table puts in a function, left unnamed by a failed naming, is named by the next try")
    func failedNamingIsNotKept() throws {
        let address = try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_retain")).address + 4
        try #require(ElfSymbolTable.function(at: address) != nil)
        let key = Symbolicator.Key(address: address, isReturnAddress: false)
        let symbolicator = Symbolicator()
        symbolicator.namingFailsForTesting.withLock { $0 = 1 }
        #expect(symbolicator.functionNames([key]) == [nil])
        #expect(symbolicator.functionNames([key]) == ["swift_retain"])
    }

    @Test("an address whose naming fails every time is kept unnamed after the last attempt, at no further cost")
    func lastingFailureIsKept() throws {
        let address = try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_release")).address + 4
        let key = Symbolicator.Key(address: address, isReturnAddress: false)
        let symbolicator = Symbolicator()
        symbolicator.namingFailsForTesting.withLock { $0 = Symbolicator.namingAttempts }
        for _ in 0..<Symbolicator.namingAttempts { #expect(symbolicator.functionNames([key]) == [nil]) }
        #expect(symbolicator.namingFailsForTesting.withLock { $0 } == 0)
        // Kept: no naming is tried again (a failure left to consume would stay).
        symbolicator.namingFailsForTesting.withLock { $0 = 1 }
        #expect(symbolicator.functionNames([key]) == [nil])
        #expect(symbolicator.namingFailsForTesting.withLock { $0 } == 1)
    }
}

extension UnsafeMutableRawPointer {
    fileprivate var address: UInt { UInt(bitPattern: self) }
}
#endif

#if os(Linux)
@Suite("Taking the image map again")
struct ImageMapRefreshTests {
    @Test("a word in the rest of the page an image's text ends in takes the image map again never")
    func pageTailIsNoNewImage() throws {
        let symbolicator = Symbolicator()
        let page = UInt(sysconf(Int32(_SC_PAGESIZE)))
        let image = try #require(
            symbolicator.loadedImages.first { $0.end % page != 0 && symbolicator.isFileBackedText($0.end) },
            "an image whose text ends inside a page")
        let generation = symbolicator.imageGeneration
        for _ in 0..<3 { _ = symbolicator.symbolicate([RawFrame(address: image.end, isUncertain: false)]) }
        #expect(symbolicator.imageGeneration == generation, "\(image.name) ends at 0x\(String(image.end, radix: 16))")
    }
}
#endif
