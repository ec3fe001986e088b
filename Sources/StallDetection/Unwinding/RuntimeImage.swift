import CStallCapture

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The image that holds Swift's concurrency runtime, and the runtime's
/// functions read from its symbol table: `libswift_Concurrency.so`, found by a
/// symbol it exports, or the executable itself when the runtime is linked
/// statically (`--static-swift-stdlib`), where nothing is exported and its
/// functions are local symbols of the executable's table.
enum RuntimeImage {
    /// The functions of the runtime's image whose names start with one of
    /// `prefixes`, at their addresses in this process; nil where no table
    /// could be read. `exported` is a function the shared runtime exports,
    /// which tells which library that is.
    static func functions(exporting exported: String, namedLike prefixes: [[UInt8]]) -> [ElfSymbolTable.Function]? {
        #if os(Linux)
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), exported) else {
            return ElfReader.withFile("/proc/self/exe") { reader in
                guard let bias = reader.loadBias(programHeaders: stallcapture_auxiliary_value(3)) else { return nil }
                return reader.functions(
                    section: ElfReader.symbolTableSection, bias: bias, names: true, namePrefixes: prefixes)
            }
        }
        var path = [CChar](repeating: 0, count: 4096)
        var base: UInt = 0
        guard stallcapture_image_of(UInt(bitPattern: symbol), &path, path.count, &base) == 1 else { return nil }
        let name = String(decoding: path.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return ElfReader.withFile(name) { reader in
            guard let firstLoad = reader.firstLoadAddress() else { return nil }
            return reader.functions(
                section: ElfReader.symbolTableSection, bias: base &- firstLoad, names: true, namePrefixes: prefixes)
        }
        #else
        return nil
        #endif
    }

    /// The address of the runtime's function `name` (exported by the shared
    /// runtime, or a local symbol of a statically linked one), or nil.
    static func address(of name: String) -> UInt? {
        #if os(Linux)
        if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) { return UInt(bitPattern: symbol) }
        return functions(exporting: name, namedLike: [Array(name.utf8)])?.first { $0.name == name }?.start
        #else
        return nil
        #endif
    }
}
