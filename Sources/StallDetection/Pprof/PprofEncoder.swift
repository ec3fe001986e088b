/// Builds a pprof `perftools.profiles.Profile` message
/// (https://github.com/google/pprof/blob/main/proto/profile.proto) from a
/// ``StallProfile``, uncompressed: ``StallProfile/pprof(labels:endedAt:)``
/// gzips it.
///
/// What goes where:
/// - `sample_type`: `samples`/`count` and `wall`/`nanoseconds` (the default);
///   `period_type` `wall`/`nanoseconds`, `period` the wall time one sample
///   stands for (``StallProfile/sampleWallNanoseconds``).
/// - one `Function` per ``StallProfile/functions`` entry, ids 1… in that order:
///   name, file; `start_line` 0, as the profile knows the lines its samples
///   were at and not where a function begins. `system_name` is left out: the
///   profile has no mangled names, and without one `go tool pprof` shows the
///   name as it is instead of cutting what it takes for C++ parameter lists
///   and templates out of it.
/// - one `Location` per function, ids 1… in the same order, with one `Line`:
///   the function and the line seen in most of its samples (0 when unknown); the
///   profile keeps no addresses, so `address` is 0.
/// - one `Mapping` per image named by a function, ids 1… in order of first use:
///   its path, build id and load range when `images` knows it (found by name),
///   else its name alone; `has_functions` (nothing for a reader to symbolize).
/// - one `Sample` per ``StallProfile/stacks`` entry: its locations leaf first,
///   values (samples, samples × period), and `labels` as string labels.
/// - `time_nanos`, `duration_nanos` (sample count × period).
///
/// A pure value.
struct PprofEncoder: Sendable {
    let profile: StallProfile
    let labels: [(key: String, value: String)]
    let images: [String: LoadedImage]
    /// Wall-clock nanoseconds since 1970 when the profile began.
    let timeNanoseconds: Int64

    private enum Field {
        static let sampleType = 1, sample = 2, mapping = 3, location = 4, function = 5, stringTable = 6
        static let timeNanos = 9, durationNanos = 10, periodType = 11, period = 12, defaultSampleType = 14
    }

    /// The encoded message.
    func encode() -> [UInt8] {
        var strings = PprofStringTable()
        var writer = ProtobufWriter()
        let period = Int64(profile.sampleWallNanoseconds.rounded())
        for (type, unit) in [("samples", "count"), ("wall", "nanoseconds")] {
            writer.message(field: Field.sampleType) { valueType(&$0, type, unit, &strings) }
        }
        writeSamples(into: &writer, period: period, &strings)
        let mappingIDs = writeMappings(into: &writer, &strings)
        writeLocations(into: &writer, mappingIDs: mappingIDs)
        writeFunctions(into: &writer, &strings)
        writer.varint(field: Field.timeNanos, timeNanoseconds)
        writer.varint(field: Field.durationNanos, Int64(profile.sampleCount) * period)
        writer.message(field: Field.periodType) { valueType(&$0, "wall", "nanoseconds", &strings) }
        writer.varint(field: Field.period, period)
        writer.varint(field: Field.defaultSampleType, strings.index("wall"))
        // Last: every string has been interned by now.
        for string in strings.strings { writer.string(field: Field.stringTable, string) }
        return writer.bytes
    }

    private func valueType(
        _ writer: inout ProtobufWriter, _ type: String, _ unit: String, _ strings: inout PprofStringTable
    ) {
        writer.varint(field: 1, strings.index(type))
        writer.varint(field: 2, strings.index(unit))
    }

    /// `Sample`: location_id (packed, leaf first), value (packed), label.
    private func writeSamples(into writer: inout ProtobufWriter, period: Int64, _ strings: inout PprofStringTable) {
        let labelIndices = labels.map { (key: strings.index($0.key), value: strings.index($0.value)) }
        for stack in profile.stacks {
            writer.message(field: Field.sample) { sample in
                sample.packedVarints(field: 1, stack.functionIndices.reversed().map { UInt64($0 + 1) })
                sample.packedVarints(field: 2, [Int64(stack.samples), Int64(stack.samples) * period])
                for label in labelIndices {
                    sample.message(field: 3) { entry in
                        entry.varint(field: 1, label.key)
                        entry.varint(field: 2, label.value)
                    }
                }
            }
        }
    }

    /// `Mapping`s, one per image; returns each image's mapping id.
    private func writeMappings(into writer: inout ProtobufWriter, _ strings: inout PprofStringTable) -> [String: UInt64]
    {
        var ids: [String: UInt64] = [:]
        var order: [String] = []
        for function in profile.functions {
            guard let image = function.image, ids[image] == nil else { continue }
            ids[image] = UInt64(order.count + 1)
            order.append(image)
        }
        for (index, name) in order.enumerated() {
            let named = profile.functions.filter { $0.image == name }
            let known = images[name]
            writer.message(field: Field.mapping) { mapping in
                mapping.varint(field: 1, UInt64(index + 1))
                if let known {
                    mapping.varint(field: 2, UInt64(known.start))
                    mapping.varint(field: 3, UInt64(known.end))
                }
                mapping.varint(field: 5, strings.index(known?.path ?? name))
                if let buildID = known?.buildIDText { mapping.varint(field: 6, strings.index(buildID)) }
                mapping.bool(field: 7, true)
                mapping.bool(field: 8, named.contains { $0.file != nil })
                mapping.bool(field: 9, named.contains { $0.line != nil })
            }
        }
        return ids
    }

    /// `Location`s: one per function, with its mapping and one `Line`.
    private func writeLocations(into writer: inout ProtobufWriter, mappingIDs: [String: UInt64]) {
        for (index, function) in profile.functions.enumerated() {
            writer.message(field: Field.location) { location in
                location.varint(field: 1, UInt64(index + 1))
                if let image = function.image, let mapping = mappingIDs[image] { location.varint(field: 2, mapping) }
                location.message(field: 4) { line in
                    line.varint(field: 1, UInt64(index + 1))
                    line.varint(field: 2, Int64(function.line ?? 0))
                }
            }
        }
    }

    /// `Function`s: id, name, file name.
    private func writeFunctions(into writer: inout ProtobufWriter, _ strings: inout PprofStringTable) {
        for (index, function) in profile.functions.enumerated() {
            let name = strings.index(function.name)
            let file = strings.index(function.file ?? "")
            writer.message(field: Field.function) { entry in
                entry.varint(field: 1, UInt64(index + 1))
                entry.varint(field: 2, name)
                entry.varint(field: 4, file)
            }
        }
    }
}
