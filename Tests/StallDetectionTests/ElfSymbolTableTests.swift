import CStallCapture
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
