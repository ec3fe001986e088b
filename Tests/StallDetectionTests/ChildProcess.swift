import Dispatch
import Foundation

/// Runs the `stall-probe` helper (built beside the test bundle) and collects what
/// it printed.
struct ProbeRun {
    struct Event {
        var id: Int
        var phase: String
        var milliseconds: Double
        var report: String
    }

    var events: [Event] = []
    var realMilliseconds: [Double] = []
    /// `SLEEP <result> <ms>` lines: what a stalled `usleep` returned and took.
    var sleeps: [(result: Int, milliseconds: Double)] = []

    /// Whether any of the scenario's sleeps, `staged` in order (one per `SLEEP`
    /// line), returned early: a look's signal reached the thread as it fell
    /// asleep (`EINTR`), so the stall the scenario staged did not happen.
    func sleepCutShort(staged: [Double]) -> Bool {
        zip(sleeps, staged).contains { sleep, milliseconds in
            sleep.result != 0 || sleep.milliseconds < milliseconds - 1
        }
    }
    /// `SAMPLING <ms>` lines, one per `.started`.
    var samplingMilliseconds: [Double] = []
    var lines: [String] = []
    var exitStatus: Int32 = -1

    /// The helper: `STALL_PROBE` when set (CI points it at a release build), else the
    /// one built beside the test bundle.
    static var probeURL: URL {
        if let path = ProcessInfo.processInfo.environment["STALL_PROBE"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        return URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("stall-probe")
    }

    /// Whether the helper is a release build (CI's matrix step).
    static var probeIsRelease: Bool { probeURL.path.contains("/release/") }

    /// Starts a process that keeps one core busy (a shell loop), without waiting
    /// for it; the caller ends it by pid.
    /// With `iterations`, the loop ends after that many rounds (a short burst, like a
    /// program starting up).
    static func spawnBurner(iterations: Int? = nil) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        if let iterations {
            process.arguments = ["-c", "i=0; while [ $i -lt \(iterations) ]; do i=$((i+1)); done"]
        } else {
            // Ends with the test process too (a killed test leaves no busy loop).
            process.arguments = ["-c", "while kill -0 \(getpid()) 2>/dev/null; do :; done"]
        }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }

    /// Runs `body` while `count` processes keep a core busy each; they are
    /// ended with SIGKILL (the shell's loop does not end on SIGTERM).
    static func withBurners<Result>(_ count: Int, _ body: () throws -> Result) throws -> Result {
        let burners = try (0..<count).map { _ in try spawnBurner() }
        defer {
            for burner in burners {
                kill(burner.processIdentifier, SIGKILL)
                burner.waitUntilExit()
            }
        }
        return try body()
    }

    /// Runs a scenario; `whileRunning` gets the child's pid once it started. A child
    /// still running after `timeLimit` is killed, so a broken detector fails the
    /// test instead of hanging it.
    /// With `traced`, the helper runs with `STALLDETECTION_TRACE=1` and its
    /// standard error (the `stalldetection sample` lines) joins ``lines``.
    static func run(
        _ arguments: [String], niceness: Int? = nil, timeLimit: Double = 60, traced: Bool = false,
        whileRunning: (Int32) -> Void = { _ in }
    ) throws -> ProbeRun {
        let process = Process()
        if let niceness {
            // `nice` execs the helper, so the pid stays the helper's.
            process.executableURL = URL(fileURLWithPath: "/usr/bin/nice")
            process.arguments = ["-n", "\(niceness)", probeURL.path] + arguments
        } else {
            process.executableURL = probeURL
            process.arguments = arguments
        }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = traced ? output : FileHandle.nullDevice
        if traced {
            process.environment = ProcessInfo.processInfo.environment.merging(["STALLDETECTION_TRACE": "1"]) { $1 }
        }
        try process.run()
        let pid = process.processIdentifier
        DispatchQueue.global().asyncAfter(deadline: .now() + timeLimit) { kill(pid, SIGKILL) }
        whileRunning(pid)
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        var run = ProbeRun()
        run.exitStatus = process.terminationStatus
        run.lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        for line in run.lines {
            let fields = line.split(separator: " ")
            if fields.first == "EVENT", fields.count == 5, let id = Int(fields[1]), let value = Double(fields[3]) {
                let report = Data(base64Encoded: String(fields[4])).map { String(decoding: $0, as: UTF8.self) } ?? ""
                run.events.append(Event(id: id, phase: String(fields[2]), milliseconds: value, report: report))
            } else if fields.first == "REAL", fields.count >= 2, let value = Double(fields[1]) {
                run.realMilliseconds.append(value)
            } else if fields.first == "SLEEP", fields.count >= 3, let result = Int(fields[1]),
                let value = Double(fields[2])
            {
                run.sleeps.append((result, value))
            } else if fields.first == "SAMPLING", fields.count >= 2, let value = Double(fields[1]) {
                run.samplingMilliseconds.append(value)
            }
        }
        return run
    }

    /// The value of the first line that starts with `key`.
    func value(_ key: String) -> [Double] {
        guard let line = lines.first(where: { $0.hasPrefix(key + " ") }) else { return [] }
        return line.split(separator: " ").dropFirst().compactMap { Double($0) }
    }

    /// The `stalldetection sample <cost µs> <naming µs> <kept> <next µs> <taken at µs>` lines
    /// of a traced run.
    var tracedSamples: [(cost: Double, naming: Double, kept: Bool)] {
        lines.compactMap { line in
            let fields = line.split(separator: " ")
            guard fields.count >= 6, fields[0] == "stalldetection", fields[1] == "sample",
                let cost = Double(fields[2]), let naming = Double(fields[3])
            else { return nil }
            return (cost, naming, fields[4] == "1")
        }
    }

    var started: [Event] { events.filter { $0.phase == "started" } }
    var ended: [Event] { events.filter { $0.phase == "ended" } }
}
