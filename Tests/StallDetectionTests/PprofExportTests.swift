import Foundation
import Testing

@testable import StallDetection

/// The pprof export read back with a decoder written here from profile.proto
/// (not the encoder's code): every figure of the profile is in it, ids are
/// 1-based and every reference resolves.
@Suite("pprof export")
struct PprofExportTests {
    /// One protobuf field as read: its number and either a varint or bytes.
    struct Field {
        var number: Int
        var varint: UInt64?
        var bytes: [UInt8]?
    }

    struct Malformed: Error {}

    static func varint(_ bytes: [UInt8], _ index: inout Int) throws -> UInt64 {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard index < bytes.count, shift < 64 else { throw Malformed() }
            let byte = bytes[index]
            index += 1
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
    }

    /// A message's fields in order; wire types 0 (varint) and 2 (length-delimited) only.
    static func fields(_ bytes: [UInt8]) throws -> [Field] {
        var index = 0
        var fields: [Field] = []
        while index < bytes.count {
            let key = try varint(bytes, &index)
            switch key & 7 {
            case 0: fields.append(Field(number: Int(key >> 3), varint: try varint(bytes, &index)))
            case 2:
                let length = Int(try varint(bytes, &index))
                guard length >= 0, index + length <= bytes.count else { throw Malformed() }
                fields.append(Field(number: Int(key >> 3), bytes: Array(bytes[index..<(index + length)])))
                index += length
            default: throw Malformed()
            }
        }
        return fields
    }

    static func packed(_ bytes: [UInt8]?) throws -> [UInt64] {
        guard let bytes else { return [] }
        var index = 0
        var values: [UInt64] = []
        while index < bytes.count { values.append(try varint(bytes, &index)) }
        return values
    }

    /// The decoded profile, as plain tables.
    struct Decoded {
        var strings: [String] = []
        var sampleTypes: [(type: Int, unit: Int)] = []
        var samples: [(locations: [UInt64], values: [UInt64], labels: [(key: Int, value: Int)])] = []
        var mappings: [[Int: Field]] = []
        var locations: [(id: UInt64, mapping: UInt64, lines: [(function: UInt64, line: UInt64)])] = []
        var functions: [(id: UInt64, name: Int, file: Int, startLine: UInt64)] = []
        var scalars: [Int: UInt64] = [:]
        var periodType: (type: Int, unit: Int)?

        func string(_ index: Int) -> String? { strings.indices.contains(index) ? strings[index] : nil }
    }

    static func decode(_ bytes: [UInt8]) throws -> Decoded {
        var decoded = Decoded()
        for field in try fields(bytes) {
            let sub = field.number == 6 ? [] : try field.bytes.map(fields) ?? []
            func value(_ number: Int) -> UInt64 { sub.last { $0.number == number }?.varint ?? 0 }
            switch field.number {
            case 1: decoded.sampleTypes.append((Int(value(1)), Int(value(2))))
            case 2:
                let labels = try sub.filter { $0.number == 3 }.map { try fields($0.bytes ?? []) }.map { label in
                    (
                        key: Int(label.last { $0.number == 1 }?.varint ?? 0),
                        value: Int(label.last { $0.number == 2 }?.varint ?? 0)
                    )
                }
                decoded.samples.append(
                    (
                        try packed(sub.first { $0.number == 1 }?.bytes),
                        try packed(sub.first { $0.number == 2 }?.bytes),
                        labels
                    ))
            case 3: decoded.mappings.append(Dictionary(sub.map { ($0.number, $0) }, uniquingKeysWith: { $1 }))
            case 4:
                let lines = try sub.filter { $0.number == 4 }.map { try fields($0.bytes ?? []) }.map { line in
                    (
                        function: line.last { $0.number == 1 }?.varint ?? 0,
                        line: line.last { $0.number == 2 }?.varint ?? 0
                    )
                }
                decoded.locations.append((value(1), value(2), lines))
            case 5: decoded.functions.append((value(1), Int(value(2)), Int(value(4)), value(5)))
            case 6: decoded.strings.append(String(decoding: field.bytes ?? [], as: UTF8.self))
            case 11: decoded.periodType = (Int(value(1)), Int(value(2)))
            default: decoded.scalars[field.number] = field.varint
            }
        }
        return decoded
    }

    /// CallTreeTests' profile (12 samples, 10 ms apart, a recursion) with files
    /// and lines, and two images.
    static func profile() -> StallProfile {
        var recorder = ProfileRecorder(capacity: 1_000)
        var time: Int64 = 0
        func add(_ names: [String], _ count: Int) {
            let frames = names.reversed().map { name in
                StallProfileTests.frame(name, line: name.count * 10, image: name == "start" ? "libc.so.6" : "App")
            }
            for _ in 0..<count {
                recorder.add(frames, at: time)
                time += 10_000_000
            }
        }
        add(["start", "A", "B", "C"], 6)
        add(["start", "A", "B", "D"], 3)
        add(["start", "A"], 2)
        add(["start", "A", "R", "R", "R"], 1)
        return recorder.profile(interval: 10_000_000)
    }

    static let images = [
        LoadedImage(name: "App", path: "/opt/app/App", buildID: [0xDE, 0xAD, 0x01], start: 0x40_0000, end: 0x50_0000)
    ]

    @Test("string_table[0] is empty; sample types samples/count and wall/nanoseconds; period and duration")
    func header() throws {
        let profile = Self.profile()
        let end = Date(timeIntervalSince1970: 1_800_000_000)
        let decoded = try Self.decode(profile.pprofMessage(labels: [], endedAt: end, images: Self.images))
        #expect(decoded.strings.first == "")
        #expect(Set(decoded.strings).count == decoded.strings.count, "each string once")
        #expect(
            decoded.sampleTypes.map { [decoded.string($0.type), decoded.string($0.unit)] } == [
                ["samples", "count"], ["wall", "nanoseconds"],
            ])
        let period = try #require(decoded.periodType)
        #expect(decoded.string(period.type) == "wall" && decoded.string(period.unit) == "nanoseconds")
        #expect(decoded.scalars[12] == 10_000_000, "the period: the samples' measured spacing")
        #expect(decoded.scalars[10] == 12 * 10_000_000, "duration_nanos: 12 samples of 10 ms")
        #expect(decoded.scalars[9] == UInt64(1_800_000_000 * 1_000_000_000 - 120_000_000), "time_nanos")
        #expect(decoded.string(Int(decoded.scalars[14] ?? 0)) == "wall", "default_sample_type")
    }

    @Test("functions, locations and mappings: ids 1… in order, every reference resolves")
    func tables() throws {
        let profile = Self.profile()
        let decoded = try Self.decode(profile.pprofMessage(labels: [], endedAt: Date(), images: Self.images))
        #expect(decoded.functions.map(\.id) == Array(1...UInt64(profile.functions.count)))
        #expect(decoded.functions.map { decoded.string($0.name) } == profile.functions.map(\.name))
        #expect(decoded.functions.map { decoded.string($0.file) } == profile.functions.map { $0.file ?? "" })
        #expect(decoded.locations.map(\.id) == Array(1...UInt64(profile.functions.count)))
        for location in decoded.locations {
            let line = try #require(location.lines.first)
            #expect(location.lines.count == 1)
            let function = profile.functions[Int(line.function) - 1]
            #expect(line.line == UInt64(function.line ?? 0), "\(function.name)")
            let mapping = try #require(decoded.mappings.first { $0[1]?.varint == location.mapping })
            let filename = decoded.string(Int(mapping[5]?.varint ?? 0))
            #expect(filename == (function.image == "App" ? "/opt/app/App" : function.image))
        }
        #expect(decoded.mappings.map { $0[1]?.varint } == Array(1...UInt64(decoded.mappings.count)))
        let app = try #require(decoded.mappings.first { decoded.string(Int($0[5]?.varint ?? 0)) == "/opt/app/App" })
        #expect(decoded.string(Int(app[6]?.varint ?? 0)) == "dead01", "the build id, hexadecimal")
        #expect(app[2]?.varint == 0x40_0000 && app[3]?.varint == 0x50_0000 && app[7]?.varint == 1)
        let libc = try #require(decoded.mappings.first { decoded.string(Int($0[5]?.varint ?? 0)) == "libc.so.6" })
        #expect(libc[6] == nil, "no build id for an image this process does not know")
    }

    @Test("samples: each stack leaf first with its count and wall time; counts per function equal the profile's")
    func samples() throws {
        let profile = Self.profile()
        let labels: [(key: String, value: String)] = [
            ("stall_id", "7"), ("activity", "screen: Feed"), ("activity", "scroll"),
        ]
        let decoded = try Self.decode(profile.pprofMessage(labels: labels, endedAt: Date(), images: []))
        #expect(decoded.samples.count == profile.stacks.count)
        #expect(decoded.samples.reduce(0) { $0 + Int($1.values[0]) } == profile.sampleCount)
        for (sample, stack) in zip(decoded.samples, profile.stacks) {
            #expect(sample.values == [UInt64(stack.samples), UInt64(stack.samples) * 10_000_000])
            let names = sample.locations.reversed().map { location in
                decoded.locations.first { $0.id == location }.flatMap { $0.lines.first }
                    .flatMap { line in decoded.functions.first { $0.id == line.function } }
                    .flatMap { decoded.string($0.name) }
            }
            #expect(names == profile.functions(of: stack).map(\.name))
            #expect(
                sample.labels.map { [decoded.string($0.key), decoded.string($0.value)] } == labels.map { [$0.0, $0.1] })
        }
        // What `go tool pprof -top` shows as cumulative samples: once per sample
        // whose stack holds the function, a recursion once.
        for (index, function) in profile.functions.enumerated() {
            let cumulative = decoded.samples.filter { $0.locations.contains(UInt64(index + 1)) }
                .reduce(0) { $0 + Int($1.values[0]) }
            #expect(cumulative == function.samples, "\(function.name)")
        }
    }

    @Test("an event's export is gzip that gzip -dc reads, labelled with the stall id, target and activities")
    func eventLabels() throws {
        var event = StallEvent(
            id: 42, phase: .ended, duration: .milliseconds(120), threshold: .milliseconds(100), target: "main queue",
            backtrace: .unavailable("not sampled"), samplingTime: .zero)
        event.profile = Self.profile()
        event.activities = ["screen: Feed", "scroll"]
        let decoded = try Self.decode(GzipStreamTests.gunzip(event.pprof()))
        let labels = try #require(decoded.samples.first?.labels)
        #expect(
            labels.map { [decoded.string($0.key), decoded.string($0.value)] } == [
                ["stall_id", "42"], ["target", "main queue"], ["activity", "screen: Feed"], ["activity", "scroll"],
            ])
        #expect(!decoded.strings.contains("task_name"), "no task name label for a thread running no task")
        event.backtrace.task = StallTask(
            id: 7, name: "ImageDecoder.run", priority: .high, basePriority: .medium, relation: .taskGroupChild)
        let named = try Self.decode(GzipStreamTests.gunzip(event.pprof()))
        #expect(named.strings.contains("task_name") && named.strings.contains("ImageDecoder.run"))
    }

    @Test("an empty profile is a valid file with no samples")
    func empty() throws {
        let decoded = try Self.decode(GzipStreamTests.gunzip(StallProfile.empty.pprof()))
        #expect(decoded.strings.first == "" && decoded.samples.isEmpty && decoded.functions.isEmpty)
        #expect(decoded.sampleTypes.count == 2)
    }
}
