import Logging

/// The command line: `--name value` pairs, each with a default.
struct ServerOptions: Sendable {
    var host = "127.0.0.1"
    var port = 8080
    /// How long an event loop must be blocked to be reported.
    var stallThresholdMilliseconds = 100
    /// How long a request may run before the watchdog logs it as slow.
    var watchdogMilliseconds = 100
    /// How long a request may run before its connection is closed.
    var requestTimeoutMilliseconds = 5000
    /// How long a request may run before it is cancelled and answered 504.
    var deadlineMilliseconds = 2000
    /// The work of the benchmark routes: bytes hashed per request.
    var workBytes = 14 * 1024
    var logLevel = Logger.Level.info
    /// Where request handlers run: on the event loops (NIO's loops installed as Swift
    /// concurrency's global executor) or on Swift concurrency's own cooperative pool.
    var handlersOnEventLoops = true

    static let usage = """
        usage: ServerExample [--host 127.0.0.1] [--port 8080] [--stall-threshold-ms 100]
                             [--watchdog-ms 100] [--request-timeout-ms 5000] [--deadline-ms 2000]
                             [--work-bytes 14336]
                             [--log-level info] [--executor eventloops|pool]
        """

    struct BadArgument: Error, CustomStringConvertible {
        var description: String
    }

    init(arguments: [String]) throws(BadArgument) {
        var remaining = arguments[...]
        while let name = remaining.popFirst() {
            guard let value = remaining.popFirst() else {
                throw BadArgument(description: "\(name) needs a value")
            }
            func number(in range: ClosedRange<Int>) throws(BadArgument) -> Int {
                guard let number = Int(value), range.contains(number) else {
                    throw BadArgument(
                        description:
                            "\(name) must be a whole number in \(range.lowerBound)...\(range.upperBound), not '\(value)'"
                    )
                }
                return number
            }
            switch name {
            case "--host": host = value
            case "--port": port = try number(in: 0...65535)
            case "--stall-threshold-ms": stallThresholdMilliseconds = try number(in: 10...60_000)
            case "--watchdog-ms": watchdogMilliseconds = try number(in: 1...3_600_000)
            case "--request-timeout-ms": requestTimeoutMilliseconds = try number(in: 1...3_600_000)
            case "--deadline-ms": deadlineMilliseconds = try number(in: 1...3_600_000)
            case "--work-bytes": workBytes = try number(in: 0...100_000_000)
            case "--log-level":
                guard let level = Logger.Level(rawValue: value) else {
                    throw BadArgument(
                        description:
                            "--log-level must be one of \(Logger.Level.allCases.map(\.rawValue)), not '\(value)'")
                }
                logLevel = level
            case "--executor":
                guard value == "eventloops" || value == "pool" else {
                    throw BadArgument(description: "--executor must be 'eventloops' or 'pool', not '\(value)'")
                }
                handlersOnEventLoops = value == "eventloops"
            default: throw BadArgument(description: "unknown option '\(name)'")
            }
        }
    }
}
