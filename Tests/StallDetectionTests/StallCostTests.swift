import Foundation
import Testing

extension StallDetectorIntegrationTests {
    /// What the detector costs, measured in the `stall-probe` helper. The bounds
    /// are for a release helper (CI's matrix step); a debug helper is only checked
    /// for the shape (the cache makes repeated stalls cheaper than the first).
    @Suite("Cost (stall-probe, real time)")
    struct Cost {
        @Test(
            "a repeated stall costs look-ups from sample to .started, not the first one's naming: the symbolication cache"
        )
        func repeatedStallIsCheap() throws {
            let run = try ProbeRun.run(["repeat", "5"])
            #expect(run.exitStatus == 0)
            #expect(run.samplingMilliseconds.count == 5, "\(run.lines)")
            guard run.samplingMilliseconds.count == 5 else { return }
            let first = run.samplingMilliseconds[0]
            let repeated = run.samplingMilliseconds.dropFirst().sorted()
            let median = repeated[repeated.count / 2]
            // What the cache promises: a repeated stall costs look-ups, far less than
            // the first (whose .started may also find its names prefetched: 0 ms).
            // Bound: half the first's time, or a floor of 2 ms (release) and 10 ms
            // (debug); beside two busy processes the medians were 0.03–0.7 ms
            // (release) and 0.5–1.4 ms (debug), 6 runs each. Printed for the record.
            print("repeated stall: \(median) ms from sample to .started, the first \(first) ms")
            let floor = ProbeRun.probeIsRelease ? 2.0 : 10.0
            #expect(median <= max(first / 2, floor), "repeated: \(repeated) ms; first \(first) ms")
        }

        /// Goal 0.1 % of a core; see "How stall reports are made" ("What it costs"). The bound
        /// here catches regressions: at most 2 times what two bare wake-ups per
        /// heartbeat cost on the same machine in the same run, and 2.4 wake-ups
        /// (voluntary context switches of the whole process) per heartbeat.
        @Test(
            "idle cost over 20 s at the default heartbeat (release)",
            .enabled(if: ProbeRun.probeIsRelease, "measured on a release build only"))
        func idleCost() throws {
            // The best of several runs: the machine is shared, and other processes'
            // load makes each wake-up of ours cost more CPU (caches, the hypervisor).
            // Per heartbeat: one firing of the probe timer on the scheduler thread and
            // one wake-up of the watched queue's worker: 2.0 measured. 2.4 fails when
            // the detector's early look, moved back at every answer, leaves a stale
            // shard target behind (2.6 before that was fixed).
            // The CPU is bounded by what the same two wake-ups per heartbeat cost on
            // this machine in this run, with none of a detector's work (scenario
            // `overhead-reference`: a thread sleeping to a 25 ms grid that posts an
            // empty block). The ratio is noisy because the reference is: 1.3-1.45 on
            // 2026-11-26; on 2026-11-28, quiet, the same commit (c4a2941) measured
            // 1.39-1.66 and the current code 1.41-2.1 (10 runs, mean 1.72, the
            // reference alone varying 64-104 ms over 20 s); beside two busy processes
            // 1.61-2.16. With that spread a bound of 2 on the best of 5 fails a
            // change that adds 0.6 of the reference (about 60 µs a heartbeat) in
            // about three runs of four and fails unchanged code about never; finer
            // costs are for the benchmark (Benchmarks/, WakeUps).
            // The other tests of this step run beside it: each run starts once the
            // machine is quiet for a moment, and there are up to 5.
            var bestRatio = Double.infinity
            var bestPerHeartbeat = Double.infinity
            for _ in 0..<5 {
                waitForQuietMachine()
                let reference = try ProbeRun.run(["overhead-reference", "10"], timeLimit: 60)
                let referenceCPU = try #require(reference.value("CPU").first, "\(reference.lines)")
                let run = try ProbeRun.run(["overhead", "20"], timeLimit: 90)
                #expect(run.exitStatus == 0)
                let cpu = try #require(run.value("CPU").first, "\(run.lines)")
                let wakeUps = try #require(run.value("WAKEUPS").first, "\(run.lines)")
                let heartbeat = try #require(run.value("HEARTBEAT").first, "\(run.lines)")
                let percent = cpu / 20_000 * 100
                let referencePercent = referenceCPU / 10_000 * 100
                let ratio = percent / max(0.01, referencePercent)
                let perHeartbeat = wakeUps / (20_000 / heartbeat)
                print(
                    "idle: \(percent) % of a core (\(ratio) × the bare heartbeat's \(referencePercent) %), "
                        + "\(wakeUps / 20) wake-ups/s, \(perHeartbeat) per heartbeat")
                bestRatio = min(bestRatio, ratio)
                bestPerHeartbeat = min(bestPerHeartbeat, perHeartbeat)
                if bestRatio <= 2 && bestPerHeartbeat <= 2.4 { break }
            }
            #expect(bestRatio <= 2, "\(bestRatio) × the bare heartbeat's cost")
            #expect(bestPerHeartbeat <= 2.4, "\(bestPerHeartbeat) wake-ups per heartbeat")
        }

        /// Waits (at most 30 s) until the whole machine used under a quarter of
        /// its CPU time over 250 ms (`/proc/stat`).
        private func waitForQuietMachine() {
            func busyAndTotal() -> (busy: Double, total: Double)? {
                // Read with open/read: /proc files report a size of 0.
                let descriptor = open("/proc/stat", O_RDONLY)
                guard descriptor >= 0 else { return nil }
                defer { close(descriptor) }
                var bytes = [UInt8](repeating: 0, count: 512)
                let count = bytes.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
                guard count > 0,
                    let line = String(decoding: bytes[..<count], as: UTF8.self).split(separator: "\n").first,
                    line.hasPrefix("cpu ")
                else { return nil }
                let values = line.split(separator: " ").dropFirst().compactMap { Double($0) }
                guard values.count >= 5 else { return nil }
                let idle = values[3] + values[4]
                let total = values.reduce(0, +)
                return (total - idle, total)
            }
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                guard let before = busyAndTotal() else { return }
                usleep(250_000)
                guard let after = busyAndTotal() else { return }
                let total = after.total - before.total
                if total <= 0 || (after.busy - before.busy) / total < 0.25 { return }
            }
        }
    }
}
