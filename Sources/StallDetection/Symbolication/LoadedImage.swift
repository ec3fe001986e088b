/// An image (the executable or a shared library) loaded in this process, as a
/// pprof export describes it in a mapping.
struct LoadedImage: Sendable, Hashable {
    /// The file name, as frames and profile functions name their image.
    var name: String
    /// The full path, when known.
    var path: String?
    /// The build id (ELF `NT_GNU_BUILD_ID`), when the image has one.
    var buildID: [UInt8]?
    /// Where the image is loaded, and where its text ends.
    var start: UInt
    var end: UInt

    /// The build id as lowercase hexadecimal, the form pprof and `readelf -n` show.
    var buildIDText: String? {
        buildID.map { bytes in
            bytes.map { byte in
                let text = String(byte, radix: 16)
                return byte < 16 ? "0" + text : text
            }.joined()
        }
    }
}
