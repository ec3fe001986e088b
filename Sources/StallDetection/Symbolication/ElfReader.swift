import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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
    /// With `namePrefixes`, only the functions whose name starts with one of
    /// them (matched on the bytes: no name of the others is made a string).
    func functions(
        section type: UInt32, bias: UInt, names: Bool, namePrefixes: [[UInt8]]? = nil
    ) -> [ElfSymbolTable.Function]? {
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
            if names || namePrefixes != nil, link < header.sectionCount {
                let stringsAt = link * 64
                strings =
                    read(
                        Self.integer(sections, stringsAt + 24, 8), Int(Self.integer(sections, stringsAt + 32, 8)))
                    ?? []
            }
            return Self.functionSymbols(symbols, strings: strings, bias: bias, namePrefixes: namePrefixes)
        }
        return nil
    }

    /// The `STT_FUNC` entries of a symbol table (24 bytes each) that are defined.
    private static func functionSymbols(
        _ symbols: [UInt8], strings: [UInt8], bias: UInt, namePrefixes: [[UInt8]]? = nil
    ) -> [ElfSymbolTable.Function] {
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
                if let namePrefixes, !namePrefixes.contains(where: { hasPrefix($0, at: nameOffset, in: strings) }) {
                    continue
                }
                found.append(
                    ElfSymbolTable.Function(
                        start: value &+ bias, size: size, name: name(at: nameOffset, in: strings)))
            }
        }
        return found
    }

    /// Whether the string at `offset` of a string table starts with `prefix`.
    private static func hasPrefix(_ prefix: [UInt8], at offset: Int, in strings: [UInt8]) -> Bool {
        guard offset >= 0, offset + prefix.count <= strings.count else { return false }
        for index in prefix.indices where strings[offset + index] != prefix[index] { return false }
        return true
    }

    /// The zero-ended string at `offset` of a string table, or nil.
    private static func name(at offset: Int, in strings: [UInt8]) -> String? {
        guard !strings.isEmpty, offset < strings.count else { return nil }
        let end = strings[offset...].firstIndex(of: 0) ?? strings.count
        return String(decoding: strings[offset..<end], as: UTF8.self)
    }
}
