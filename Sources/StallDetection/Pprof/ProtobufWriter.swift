/// Writes Protocol Buffers' wire format (proto3), field by field, into bytes:
/// what the pprof export needs and no more — varints, length-delimited fields
/// (strings, bytes, nested messages) and packed repeated varints.
///
/// A field equal to its default (0, "", empty) is written all the same when
/// asked for: proto3 readers take it as the default either way, and the pprof
/// builder leaves out what it has no value for by not calling the method.
///
/// A pure value; not thread-safe to share while writing.
struct ProtobufWriter: Sendable {
    /// The wire types this writer emits.
    enum WireType: UInt64 {
        case varint = 0
        case lengthDelimited = 2
    }

    /// The bytes written so far.
    private(set) var bytes: [UInt8] = []

    init() {}

    /// Appends `value` as a base-128 varint: seven bits a byte, least significant
    /// first, the high bit set on every byte but the last.
    mutating func rawVarint(_ value: UInt64) {
        var rest = value
        while rest >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: rest) | 0x80)
            rest >>= 7
        }
        bytes.append(UInt8(rest))
    }

    /// A field's key: its number and wire type.
    mutating func key(field: Int, _ type: WireType) {
        rawVarint(UInt64(field) << 3 | type.rawValue)
    }

    /// An `int64`, `uint64` or `bool` field (a negative `int64` takes ten bytes, as
    /// the format says).
    mutating func varint(field: Int, _ value: Int64) {
        key(field: field, .varint)
        rawVarint(UInt64(bitPattern: value))
    }

    /// A `uint64` field.
    mutating func varint(field: Int, _ value: UInt64) {
        key(field: field, .varint)
        rawVarint(value)
    }

    /// A `bool` field.
    mutating func bool(field: Int, _ value: Bool) {
        varint(field: field, UInt64(value ? 1 : 0))
    }

    /// A `bytes` field, or any length-delimited one: its length, then `value`.
    mutating func lengthDelimited(field: Int, _ value: [UInt8]) {
        key(field: field, .lengthDelimited)
        rawVarint(UInt64(value.count))
        bytes += value
    }

    /// A `string` field, UTF-8.
    mutating func string(field: Int, _ value: String) {
        lengthDelimited(field: field, Array(value.utf8))
    }

    /// A packed `repeated int64`/`uint64` field: one length-delimited field holding
    /// the varints. Nothing is written for an empty list.
    mutating func packedVarints(field: Int, _ values: [UInt64]) {
        guard !values.isEmpty else { return }
        var packed = ProtobufWriter()
        for value in values { packed.rawVarint(value) }
        lengthDelimited(field: field, packed.bytes)
    }

    /// A packed `repeated int64` field.
    mutating func packedVarints(field: Int, _ values: [Int64]) {
        packedVarints(field: field, values.map { UInt64(bitPattern: $0) })
    }

    /// A nested message, written by `body` into a writer of its own.
    mutating func message(field: Int, _ body: (inout ProtobufWriter) -> Void) {
        var nested = ProtobufWriter()
        body(&nested)
        lengthDelimited(field: field, nested.bytes)
    }
}
