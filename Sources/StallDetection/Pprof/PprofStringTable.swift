/// The `string_table` of a pprof profile: every string once, each field that
/// names one holding its index. Index 0 is "", as the format requires.
struct PprofStringTable: Sendable {
    /// The strings, in the order they were first asked for.
    private(set) var strings: [String] = [""]
    private var indices: [String: Int64] = ["": 0]

    init() {}

    /// The index of `string`, added if it is new.
    mutating func index(_ string: String) -> Int64 {
        if let known = indices[string] { return known }
        let index = Int64(strings.count)
        strings.append(string)
        indices[string] = index
        return index
    }
}
