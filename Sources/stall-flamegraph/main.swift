// stall-flamegraph: renders folded stacks (StallProfile.foldedStacks(), or any
// file in the format of flamegraph.pl) as a flame graph in SVG.
//
//     swift run stall-flamegraph stall.folded > stall.svg
//     swift run stall-flamegraph --title "Stall #1" < stall.folded > stall.svg
//
// The root is at the bottom, callers below callees; a frame's width is its share
// of the samples, siblings in alphabetical order (as flamegraph.pl draws them);
// hovering a frame shows its name and samples.

import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One call path of the graph: its samples and the functions it called.
final class Node {
    let name: String
    var samples = 0
    var children: [String: Node] = [:]

    init(name: String) { self.name = name }

    /// The depth of the deepest path below and including this node, found
    /// without recursion (a stack may be thousands of frames deep).
    var depth: Int {
        var deepest = 0
        var pending: [(Node, Int)] = [(self, 1)]
        while let (node, level) = pending.popLast() {
            deepest = max(deepest, level)
            pending += node.children.values.map { ($0, level + 1) }
        }
        return deepest
    }
}

enum FoldedInput {
    /// The tree of `text`'s lines ("a;b;c 12", LF or CRLF); a line that does not
    /// end in a count, or whose count would overflow the total, is reported on
    /// standard error by its number and skipped.
    static func parse(_ text: String) -> Node {
        let root = Node(name: "all")
        let lines = text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
        for (number, line) in lines.enumerated() {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty { continue }
            guard let space = trimmed.lastIndex(of: " "), let count = Int(trimmed[trimmed.index(after: space)...]),
                count > 0
            else {
                complain("line \(number + 1) has no sample count: \(line)")
                continue
            }
            guard !root.samples.addingReportingOverflow(count).overflow else {
                complain("line \(number + 1): the total of the counts would overflow; skipped")
                continue
            }
            var node = root
            root.samples += count
            for name in trimmed[..<space].split(separator: ";") {
                let key = String(name)
                let child = node.children[key] ?? Node(name: key)
                node.children[key] = child
                child.samples += count
                node = child
            }
        }
        return root
    }

    static func complain(_ message: String) {
        FileHandle.standardError.write(Data("stall-flamegraph: \(message)\n".utf8))
    }
}

struct FlameGraphSVG {
    let title: String
    let width = 1200.0
    let frameHeight = 17.0
    let margin = 10.0
    let top = 40.0

    func render(_ root: Node) -> String {
        let depth = root.depth
        let height = top + Double(depth) * frameHeight + margin * 2
        var out = """
            <?xml version="1.0" standalone="no"?>
            <svg version="1.1" width="\(Int(width))" height="\(Int(height))" viewBox="0 0 \(Int(width)) \(Int(height))" \
            xmlns="http://www.w3.org/2000/svg" font-family="Verdana, sans-serif" font-size="11">
            <rect x="0" y="0" width="100%" height="100%" fill="#f8f8f8"/>
            <text x="\(Int(width / 2))" y="24" text-anchor="middle" font-size="16">\(escape(title))</text>

            """
        let scale = root.samples > 0 ? (width - 2 * margin) / Double(root.samples) : 0
        draw(root, x: margin, level: 0, scale: scale, total: root.samples, height: height, into: &out)
        out += "</svg>\n"
        return out
    }

    /// Draws `root` and everything above it, without recursion.
    private func draw(
        _ root: Node, x: Double, level: Int, scale: Double, total: Int, height: Double, into out: inout String
    ) {
        var pending: [(node: Node, x: Double, level: Int)] = [(root, x, level)]
        while let (node, x, level) = pending.popLast() {
            let width = Double(node.samples) * scale
            guard width >= 0.3 else { continue }
            let y = height - margin - Double(level + 1) * frameHeight
            out += frame(node, x: x, y: y, width: width, total: total)
            var childX = x
            for child in node.children.values.sorted(by: { $0.name < $1.name }) {
                pending.append((child, childX, level + 1))
                childX += Double(child.samples) * scale
            }
        }
    }

    private func frame(_ node: Node, x: Double, y: Double, width: Double, total: Int) -> String {
        let share = total > 0 ? Double(node.samples) / Double(total) * 100 : 0
        let label = "\(node.name) (\(node.samples) samples, \(String(format: "%.1f", share)) %)"
        var out = "<g><title>\(escape(label))</title>"
        out += "<rect x=\"\(format(x))\" y=\"\(format(y))\" width=\"\(format(width))\" "
        out += "height=\"\(format(frameHeight - 1))\" fill=\"\(color(node.name))\" rx=\"2\"/>"
        let fits = Int((width - 6) / 6.6)
        if fits >= 3 {
            let text = node.name.count <= fits ? node.name : String(node.name.prefix(fits - 2)) + ".."
            out += "<text x=\"\(format(x + 3))\" y=\"\(format(y + frameHeight - 5))\">\(escape(text))</text>"
        }
        return out + "</g>\n"
    }

    /// Warm colours, the same for the same name in every graph.
    private func color(_ name: String) -> String {
        let hash = name.utf8.reduce(UInt32(2_166_136_261)) { ($0 ^ UInt32($1)) &* 16_777_619 }
        let red = 205 + Int(hash % 50)
        let green = 80 + Int((hash >> 8) % 150)
        let blue = Int((hash >> 16) % 55)
        return "rgb(\(red),\(green),\(blue))"
    }

    private func format(_ value: Double) -> String { String(format: "%.1f", value) }

    /// `text` as XML character data: markup characters escaped, and what XML
    /// cannot hold (control characters, U+FFFE, U+FFFF) replaced by U+FFFD.
    private func escape(_ text: String) -> String {
        var result = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&quot;"
            case "\t", "\n", "\r": result.unicodeScalars.append(scalar)
            case _ where scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF:
                result += "\u{FFFD}"
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}

var arguments = Array(CommandLine.arguments.dropFirst())
var title = "Flame graph"
if let index = arguments.firstIndex(of: "--title"), index + 1 < arguments.count {
    title = arguments[index + 1]
    arguments.removeSubrange(index...index + 1)
}
if arguments.contains("--help") || arguments.count > 1 {
    print(
        "usage: stall-flamegraph [--title TITLE] [FILE.folded]   (standard input without FILE; SVG on standard output)")
    exit(arguments.contains("--help") ? 0 : 2)
}
let input: Data?
if let path = arguments.first {
    input = FileManager.default.contents(atPath: path)
    if input == nil {
        FoldedInput.complain("cannot read \(path)")
        exit(1)
    }
} else {
    input = FileHandle.standardInput.readDataToEndOfFile()
}
let root = FoldedInput.parse(String(decoding: input ?? Data(), as: UTF8.self))
if root.samples == 0 {
    FoldedInput.complain("no stacks in the input")
    exit(1)
}
print(FlameGraphSVG(title: title).render(root), terminator: "")
