#if os(Linux)
import CStallCapture

extension Symbolicator {
    /// The most bytes glibc's `_init` (the `.init` section's one function) spans.
    private static let initFunctionSize = 0x20

    /// The name a person should read for a function `Runtime` named `name` at
    /// `offset` bytes into it. A library's PLT follows its `.init` section, and
    /// its stubs have no symbol: `Runtime` names an address in one after the
    /// nearest symbol before it, `_init`, far past that function's end. Such an
    /// address is named after the stub's target, as gdb names it
    /// (`swift_get_time@plt`); a stub whose target cannot be read or named keeps
    /// `Runtime`'s name.
    static func readableFunction(_ name: String, offset: Int, at address: UInt) -> String {
        guard name == "_init", offset >= initFunctionSize else { return name }
        let blocks = MemoryBlocks()
        // `.plt` and `.plt.sec` stubs are 16 bytes, 16-byte aligned; `.plt.got`
        // stubs (`jmp *slot(%rip)` and a 2-byte nop) 8 bytes, 8-byte aligned: the
        // 8-byte start is tried first, so that an address in the second of two
        // short stubs is not named after the first.
        let starts = [address & ~0x7, address & ~0xF]
        let read: (UInt) -> UInt? = { blocks.word(at: $0) }
        guard let target = starts.lazy.compactMap({ CallSite.pltTarget(ofStub: $0, readWord: read) }).first else {
            return name
        }
        var buffer = [CChar](repeating: 0, count: 512)
        guard stallcapture_exported_name(target, &buffer, buffer.count) == 1 else { return name }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + "@plt"
    }
}
#endif
