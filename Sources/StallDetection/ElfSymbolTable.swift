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

/// Reads an ELF64 image's headers and symbol tables through `read(offset, count)`
/// (a file, or memory). Little-endian, as every platform this runs on.
struct ElfReader {
    let read: (UInt, Int) -> [UInt8]?

    static let symbolTableSection: UInt32 = 2  // SHT_SYMTAB
    static let dynamicSymbolSection: UInt32 = 11  // SHT_DYNSYM

    init(read: @escaping (UInt, Int) -> [UInt8]?) {
        self.read = read
    }

    /// Runs `body` with a reader of the file at `path` (nil if it cannot be opened).
    static func withFile<Result>(_ path: String, _ body: (ElfReader) -> Result?) -> Result? {
        #if os(Linux)
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        return body(
            ElfReader { offset, count in
                var bytes = [UInt8](repeating: 0, count: count)
                let read = bytes.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, count, off_t(offset)) }
                return read == count ? bytes : nil
            })
        #else
        return nil
        #endif
    }

    /// Little-endian unsigned integer of `size` bytes at `offset` of `bytes`.
    static func integer(_ bytes: [UInt8], _ offset: Int, _ size: Int) -> UInt {
        var value: UInt = 0
        for index in stride(from: size - 1, through: 0, by: -1) { value = value << 8 | UInt(bytes[offset + index]) }
        return value
    }

    /// The ELF header's fields this reader needs, or nil if it is no ELF64 image.
    func header() -> (programHeaders: UInt, programCount: Int, sections: UInt, sectionCount: Int)? {
        guard let bytes = read(0, 64), bytes[0] == 0x7F, bytes[1] == 0x45, bytes[2] == 0x4C, bytes[3] == 0x46,
            bytes[4] == 2
        else { return nil }
        return (
            Self.integer(bytes, 32, 8), Int(Self.integer(bytes, 56, 2)), Self.integer(bytes, 40, 8),
            Int(Self.integer(bytes, 60, 2))
        )
    }

    /// The difference between where the image is loaded and its link-time
    /// addresses, given where its program headers are in memory (`AT_PHDR`).
    func loadBias(programHeaders address: UInt) -> UInt? {
        guard address != 0, let header = header(), header.programCount > 0,
            let table = read(header.programHeaders, header.programCount * 56)
        else { return nil }
        for index in 0..<header.programCount {
            let entry = index * 56
            // The loadable segment whose file range holds the program headers.
            guard Self.integer(table, entry, 4) == 1 else { continue }  // PT_LOAD
            let offset = Self.integer(table, entry + 8, 8)
            let virtual = Self.integer(table, entry + 16, 8)
            let size = Self.integer(table, entry + 32, 8)
            if header.programHeaders >= offset && header.programHeaders < offset &+ size {
                return address &- (virtual &+ (header.programHeaders &- offset))
            }
        }
        return nil
    }

    /// The page-aligned address of the first loadable segment (where `dladdr`
    /// says the image begins), or nil.
    func firstLoadAddress() -> UInt? {
        guard let header = header(), header.programCount > 0,
            let table = read(header.programHeaders, header.programCount * 56)
        else { return nil }
        for index in 0..<header.programCount where Self.integer(table, index * 56, 4) == 1 {  // PT_LOAD
            return Self.integer(table, index * 56 + 16, 8) & ~UInt(4_095)
        }
        return nil
    }

    /// The function symbols of the first section of type `section`, their
    /// addresses moved by `bias`; names only when asked for.
    func functions(section type: UInt32, bias: UInt, names: Bool) -> [ElfSymbolTable.Function]? {
        guard let header = header(), header.sectionCount > 0,
            let sections = read(header.sections, header.sectionCount * 64)
        else { return nil }
        for index in 0..<header.sectionCount where Self.integer(sections, index * 64 + 4, 4) == UInt(type) {
            let entry = index * 64
            let offset = Self.integer(sections, entry + 24, 8)
            let size = Int(Self.integer(sections, entry + 32, 8))
            let link = Int(Self.integer(sections, entry + 40, 4))
            guard size > 0, size < 1 << 30, let symbols = read(offset, size) else { return nil }
            var strings: [UInt8] = []
            if names, link < header.sectionCount {
                let stringsAt = link * 64
                strings =
                    read(
                        Self.integer(sections, stringsAt + 24, 8), Int(Self.integer(sections, stringsAt + 32, 8)))
                    ?? []
            }
            return Self.functionSymbols(symbols, strings: strings, bias: bias)
        }
        return nil
    }

    /// The `STT_FUNC` entries of a symbol table (24 bytes each) that are defined.
    private static func functionSymbols(_ symbols: [UInt8], strings: [UInt8], bias: UInt) -> [ElfSymbolTable.Function] {
        var found: [ElfSymbolTable.Function] = []
        symbols.withUnsafeBytes { table in
            var entry = 0
            while entry + 24 <= table.count {
                defer { entry += 24 }
                let info = table[entry + 4]
                let sectionIndex = table.loadUnaligned(fromByteOffset: entry + 6, as: UInt16.self)
                guard info & 0xF == 2, sectionIndex != 0 else { continue }  // STT_FUNC, defined
                let value = UInt(table.loadUnaligned(fromByteOffset: entry + 8, as: UInt64.self))
                let size = UInt(table.loadUnaligned(fromByteOffset: entry + 16, as: UInt64.self))
                let nameOffset = Int(table.loadUnaligned(fromByteOffset: entry, as: UInt32.self))
                found.append(
                    ElfSymbolTable.Function(
                        start: value &+ bias, size: size, name: name(at: nameOffset, in: strings)))
            }
        }
        return found
    }

    /// The zero-ended string at `offset` of a string table, or nil.
    private static func name(at offset: Int, in strings: [UInt8]) -> String? {
        guard !strings.isEmpty, offset < strings.count else { return nil }
        let end = strings[offset...].firstIndex(of: 0) ?? strings.count
        return String(decoding: strings[offset..<end], as: UTF8.self)
    }
}
