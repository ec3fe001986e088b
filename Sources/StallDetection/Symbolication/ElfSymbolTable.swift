import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The functions of one ELF image, from its symbol table: where each starts, how
/// long it is, and (when asked for) its name. Immutable once read, so any thread
/// may look up an address without a lock.
///
/// Two images are read this way on Linux:
/// - the main executable (``executable``), whose `.symtab` lists every function
///   with its exact start: the unwinder asks for function starts while it proves
///   a sleeping thread's frames, and a look-up here is a binary search, where
///   asking the toolchain's `Runtime` symbolicates the address in full (debug
///   information included: tens of milliseconds in a debug build's first stall);
/// - the vDSO (``vdso``), the kernel's code mapped into every process
///   (`clock_gettime`, `gettimeofday`), which no image map lists: its functions
///   are named from its dynamic symbol table, as gdb names them.
struct ElfSymbolTable: Sendable {
    struct Function: Sendable {
        var start: UInt
        var size: UInt
        var name: String?
    }

    /// The functions, sorted by start.
    let functions: [Function]
    /// The image's name in reports ("[vdso]" for the vDSO).
    let imageName: String
    /// The lowest and highest address the functions cover.
    let range: Range<UInt>

    init(functions: [Function], imageName: String) {
        var sorted = functions.filter { $0.start != 0 }
        sorted.sort { $0.start < $1.start }
        self.functions = sorted
        self.imageName = imageName
        let low = sorted.first?.start ?? 0
        var high = low
        for function in sorted { high = max(high, function.start &+ max(1, function.size)) }
        self.range = low..<high
    }

    /// The function `address` lies in, if the table has one there.
    func function(containing address: UInt) -> Function? {
        guard range.contains(address) else { return nil }
        var low = 0
        var high = functions.count
        while low < high {
            let middle = (low + high) / 2
            if functions[middle].start <= address { low = middle + 1 } else { high = middle }
        }
        // The nearest start below may be a symbol nested in a larger function (a
        // local label, an alias of its tail): the few before it are tried too.
        var index = low - 1
        while index >= 0 && index >= low - 8 {
            let found = functions[index]
            if address < found.start &+ max(1, found.size) { return found }
            index -= 1
        }
        return nil
    }

    /// The main executable's functions (no names), read once from
    /// `/proc/self/exe`; nil where that cannot be read or has no symbol table.
    static let executable: ElfSymbolTable? = {
        #if os(Linux)
        return ElfReader.withFile("/proc/self/exe") { reader in
            guard let bias = reader.loadBias(programHeaders: stallcapture_auxiliary_value(3)) else { return nil }
            return reader.functions(section: ElfReader.symbolTableSection, bias: bias, names: false).map {
                ElfSymbolTable(functions: $0, imageName: "")
            }
        }
        #else
        return nil
        #endif
    }()

    /// The vDSO's functions with their names, read from memory once; nil where
    /// the kernel maps none.
    static let vdso: ElfSymbolTable? = {
        #if os(Linux)
        let base = stallcapture_auxiliary_value(33)
        guard base != 0 else { return nil }
        // The vDSO is one small read-only image, mapped whole: its headers and
        // tables lie within its first pages.
        let reader = ElfReader { offset, count in
            guard offset < 1 << 20, count < 1 << 20, let start = UnsafeRawPointer(bitPattern: base &+ offset) else {
                return nil
            }
            return [UInt8](UnsafeRawBufferPointer(start: start, count: count))
        }
        guard let header = reader.header(), let bias = reader.loadBias(programHeaders: base &+ header.programHeaders)
        else { return nil }
        return reader.functions(section: ElfReader.dynamicSymbolSection, bias: bias, names: true).map {
            ElfSymbolTable(functions: Self.preferredNames($0), imageName: "[vdso]")
        }
        #else
        return nil
        #endif
    }()

    /// The function holding `address` in any loaded image: the executable's,
    /// the vDSO's, or a library's table (each library's read from its file
    /// once); nil where no table says.
    static func function(at address: UInt) -> Function? {
        if let found = executable?.function(containing: address) ?? vdso?.function(containing: address) {
            return found
        }
        return library(containing: address)?.function(containing: address)
    }

    /// The tables of the libraries read so far, by path and load address (nil:
    /// none to read).
    private static let libraries = Locked<[String: ElfSymbolTable?]>([:])

    /// The table of the library that holds `address`.
    private static func library(containing address: UInt) -> ElfSymbolTable? {
        var path = [CChar](repeating: 0, count: 4096)
        var base: UInt = 0
        guard stallcapture_image_of(address, &path, path.count, &base) == 1 else { return nil }
        let name = String(decoding: path.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let key = "\(name)@\(base)"
        if let known = libraries.withLock({ $0[key] }) { return known }
        let table = read(library: name, base: base)
        libraries.withLock { $0[key] = table }
        return table
    }

    /// A library's functions (no names), from its file: the symbol table, or the
    /// dynamic one where the file has none.
    private static func read(library path: String, base: UInt) -> ElfSymbolTable? {
        #if os(Linux)
        return ElfReader.withFile(path) { reader in
            guard let firstLoad = reader.firstLoadAddress() else { return nil }
            let bias = base &- firstLoad
            let functions =
                reader.functions(section: ElfReader.symbolTableSection, bias: bias, names: false)
                ?? reader.functions(section: ElfReader.dynamicSymbolSection, bias: bias, names: false)
            return functions.map { ElfSymbolTable(functions: $0, imageName: path) }
        }
        #else
        return nil
        #endif
    }

    /// One function per start: the vDSO exports each under two names
    /// (`__vdso_clock_gettime` and `clock_gettime`); the one without the prefix
    /// is the one a debugger shows.
    private static func preferredNames(_ functions: [Function]) -> [Function] {
        var byStart: [UInt: Function] = [:]
        for function in functions {
            if let known = byStart[function.start], let name = known.name, !name.hasPrefix("__") { continue }
            byStart[function.start] = function
        }
        return Array(byStart.values)
    }
}
