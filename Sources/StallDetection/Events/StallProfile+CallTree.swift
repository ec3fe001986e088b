#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension StallProfile {
    /// One distinct stack of a profile and how many samples had exactly it.
    ///
    /// Its functions are positions in ``StallProfile/functions``, outermost (the
    /// thread's root) first, innermost (what was running) last; a recursion has
    /// one position per call. Frames the unwinder only guessed are not in it, as
    /// they are not counted in ``StallProfile/functions``.
    public struct Stack: Sendable, Hashable {
        /// The stack's functions, root first, as positions in
        /// ``StallProfile/functions``.
        public let functionIndices: [Int]
        /// How many samples had exactly this stack.
        public let samples: Int
    }

    /// One node of ``StallProfile/callTree``: a function reached by one call
    /// path, with the samples that passed through it.
    public struct CallTreeNode: Sendable, Hashable, CustomStringConvertible {
        /// The function; nil for the root, which stands for all samples.
        public let function: Function?
        /// The samples whose stack went through this call path.
        public let samples: Int
        /// The samples whose stack ended here: this function itself was running.
        public let selfSamples: Int
        /// The functions called from here, most samples first.
        public let children: [CallTreeNode]

        /// The tree, one node a line, indented by depth, with each node's share
        /// of the root's samples; nodes under 1 % of the samples are left out.
        public var description: String {
            let total = max(1, samples)
            var lines = ["call tree (\(samples) samples):"]
            // Depth first, without recursion (a stack can be 1,024 deep).
            var pending: [(node: CallTreeNode, depth: Int)] = children.reversed().map { ($0, 0) }
            while let (node, depth) = pending.popLast() {
                guard node.samples * 100 >= total else { continue }
                let share = StallProfile.percent(Double(node.samples) / Double(total))
                lines.append(share + "  " + String(repeating: "  ", count: depth) + (node.function?.name ?? "?"))
                pending += node.children.reversed().map { ($0, depth + 1) }
            }
            return lines.joined(separator: "\n")
        }
    }

    /// The functions of `stack`, root first.
    public func functions(of stack: Stack) -> [Function] {
        stack.functionIndices.compactMap { functions.indices.contains($0) ? functions[$0] : nil }
    }

    /// The sampled stacks as a call tree: the root stands for all samples, its
    /// children are the threads' outermost functions, and each node's children
    /// are the functions it called, most samples first.
    ///
    /// ```swift
    /// for await event in detector.events where event.phase == .ended {
    ///     print(event.profile.callTree)
    /// }
    /// // call tree (88 samples):
    /// // 100.0 %  start_thread
    /// // 100.0 %    _dispatch_worker_thread2
    /// //  …
    /// //  67.0 %            decodeThumbnails()
    /// //  33.0 %            applyFilters()
    /// ```
    public var callTree: CallTreeNode {
        var builder = CallTreeBuilder()
        for stack in stacks { builder.add(stack) }
        return builder.node(0, functions: functions)
    }

    /// The stacks in the folded format of flamegraph.pl, inferno and speedscope:
    /// one line a distinct stack, its functions root first separated by `;`, a
    /// space, and its sample count.
    ///
    /// ```
    /// start_thread;_dispatch_worker_thread2;…;decodeThumbnails() 59
    /// start_thread;_dispatch_worker_thread2;…;applyFilters() 29
    /// ```
    ///
    /// A `;` or a line break in a function's name becomes a space, so every
    /// line splits the same way; a stack with no function (a sample whose frames
    /// were all uncertain) is `<unknown>`. Render a flame graph with
    /// `flamegraph.pl stall.folded > stall.svg`, `inferno-flamegraph`, or
    /// `swift run stall-flamegraph stall.folded > stall.svg` in this package.
    public func foldedStacks() -> String {
        stacks.map { stack in
            let names = functions(of: stack).map { Self.foldedName($0.name) }
            return (names.isEmpty ? "<unknown>" : names.joined(separator: ";")) + " \(stack.samples)\n"
        }.joined()
    }

    private static func foldedName(_ name: String) -> String {
        String(name.map { $0 == ";" || $0.isNewline ? " " : $0 })
    }

    /// The profile in speedscope's file format (JSON; open it at
    /// https://www.speedscope.app or with `speedscope file.json`): one sampled
    /// profile named `title`, a frame per function with its file and line, and
    /// each distinct stack weighted by the time its samples stand for, in
    /// milliseconds (the span over the samples, shared evenly), as in
    /// ``pprof(labels:endedAt:)``.
    public func speedscopeJSON(title: String = "stall") -> String {
        let perSample = sampleWallNanoseconds / 1e6
        let weights = stacks.map { Double($0.samples) * perSample }
        let file = SpeedscopeFile(
            shared: .init(frames: functions.map { .init(name: $0.name, file: $0.file, line: $0.line) }),
            profiles: [
                .init(
                    name: title, endValue: weights.reduce(0, +), samples: stacks.map(\.functionIndices),
                    weights: weights)
            ],
            name: title)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let data = try? encoder.encode(file) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }
}

/// speedscope's file format (https://www.speedscope.app/file-format-schema.json),
/// the sampled kind.
private struct SpeedscopeFile: Encodable {
    struct Frame: Encodable {
        var name: String
        var file: String?
        var line: Int?
    }

    struct Shared: Encodable {
        var frames: [Frame]
    }

    struct Profile: Encodable {
        var type = "sampled"
        var name: String
        var unit = "milliseconds"
        var startValue = 0.0
        var endValue: Double
        var samples: [[Int]]
        var weights: [Double]
    }

    var schema = "https://www.speedscope.app/file-format-schema.json"
    var shared: Shared
    var profiles: [Profile]
    var name: String
    var activeProfileIndex = 0
    var exporter = "SafeTimers StallDetection"

    enum CodingKeys: String, CodingKey {
        case schema = "$schema"
        case shared, profiles, name, activeProfileIndex, exporter
    }
}

/// Builds ``StallProfile/callTree`` from the stacks: a node per distinct call
/// path, found by (parent, function).
private struct CallTreeBuilder {
    private var function: [Int] = [-1]
    private var samples: [Int] = [0]
    private var selfSamples: [Int] = [0]
    private var children: [[Int]] = [[]]
    private var index: [Pair: Int] = [:]

    private struct Pair: Hashable {
        var parent: Int
        var function: Int
    }

    mutating func add(_ stack: StallProfile.Stack) {
        var node = 0
        samples[0] += stack.samples
        for position in stack.functionIndices {
            let pair = Pair(parent: node, function: position)
            if let known = index[pair] {
                node = known
            } else {
                function.append(position)
                samples.append(0)
                selfSamples.append(0)
                children.append([])
                children[node].append(function.count - 1)
                index[pair] = function.count - 1
                node = function.count - 1
            }
            samples[node] += stack.samples
        }
        selfSamples[node] += stack.samples
    }

    /// The tree from `node` down, built without recursion: a node is made after
    /// its children, and every child was added after its parent.
    func node(_ node: Int, functions: [StallProfile.Function]) -> StallProfile.CallTreeNode {
        var built: [StallProfile.CallTreeNode?] = Array(repeating: nil, count: function.count)
        for index in stride(from: function.count - 1, through: node, by: -1) {
            let kids = children[index].sorted {
                samples[$0] != samples[$1] ? samples[$0] > samples[$1] : $0 < $1
            }
            built[index] = StallProfile.CallTreeNode(
                function: functions.indices.contains(function[index]) ? functions[function[index]] : nil,
                samples: samples[index], selfSamples: selfSamples[index], children: kids.compactMap { built[$0] })
            for kid in kids { built[kid] = nil }
        }
        return built[node] ?? StallProfile.CallTreeNode(function: nil, samples: 0, selfSamples: 0, children: [])
    }
}
