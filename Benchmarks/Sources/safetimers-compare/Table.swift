import Foundation

/// One line of the comparison: SafeTimers and a peer on the same work.
struct Comparison {
    var work: String
    var peer: String
    var safeTimers: Double
    var peerValue: Double
    var unit: String

    /// SafeTimers' figure divided by the peer's: below 1 means SafeTimers needs less.
    var ratio: Double { peerValue == 0 ? .nan : safeTimers / peerValue }
}

func format(_ value: Double, decimals: Int = 1) -> String {
    guard value.isFinite else { return "—" }
    var text = String(Int((value * pow10(decimals)).rounded()))
    if decimals > 0 {
        let negative = text.hasPrefix("-")
        if negative { text.removeFirst() }
        while text.count <= decimals { text = "0" + text }
        text.insert(".", at: text.index(text.endIndex, offsetBy: -decimals))
        if negative { text = "-" + text }
    }
    return text
}

private func pow10(_ exponent: Int) -> Double {
    var result = 1.0
    for _ in 0..<exponent { result *= 10 }
    return result
}

func printTable(_ rows: [Comparison]) {
    let headers = ["work", "peer", "SafeTimers", "peer value", "unit", "SafeTimers/peer"]
    let cells = rows.map { row in
        [
            row.work, row.peer, format(row.safeTimers), format(row.peerValue), row.unit,
            row.ratio.isFinite ? format(row.ratio, decimals: 3) : "—",
        ]
    }
    let widths = headers.indices.map { column in
        max(headers[column].count, cells.map { $0[column].count }.max() ?? 0)
    }
    func line(_ values: [String]) -> String {
        "| "
            + values.enumerated().map { $1.padding(toLength: widths[$0], withPad: " ", startingAt: 0) }
            .joined(separator: " | ") + " |"
    }
    print(line(headers))
    print("|" + widths.map { String(repeating: "-", count: $0 + 2) }.joined(separator: "|") + "|")
    for row in cells { print(line(row)) }
}

func printLatenessTable(_ rows: [(String, Int, Lateness.Percentiles)]) {
    print("| mechanism              | timers | p50 µs   | p99 µs   | max µs   | fired early |")
    print("|------------------------|--------|----------|----------|----------|-------------|")
    for (name, count, result) in rows {
        let cells = [
            name.padding(toLength: 22, withPad: " ", startingAt: 0),
            "\(count)".padding(toLength: 6, withPad: " ", startingAt: 0),
            format(result.p50).padding(toLength: 8, withPad: " ", startingAt: 0),
            format(result.p99).padding(toLength: 8, withPad: " ", startingAt: 0),
            (result.max > 1e12 ? "never" : format(result.max)).padding(toLength: 8, withPad: " ", startingAt: 0),
            "\(result.early)".padding(toLength: 11, withPad: " ", startingAt: 0),
        ]
        print("| " + cells.joined(separator: " | ") + " |")
    }
}
