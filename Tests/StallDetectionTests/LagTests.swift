import Dispatch
import Foundation
import Testing

@testable import StallDetection

@Suite("Lag histogram and snapshots")
struct LagTests {
    /// The exact value at the same rank as `LagHistogram.value(atFraction:)`.
    static func exact(_ sorted: [Int64], fraction: Double) -> Int64 {
        let rank = max(1, Int((fraction * Double(sorted.count) * (1 - 1e-12)).rounded(.up)))
        return sorted[rank - 1]
    }

    @Test("every value lies in the range of its bucket, and the buckets tile 0...Int64.max in order")
    func bucketsTile() {
        var expectedLow: Int64 = 0
        for bucket in 0..<LagHistogram.bucketCount {
            let range = LagHistogram.range(of: bucket)
            #expect(range.lowerBound == expectedLow, "bucket \(bucket)")
            #expect(LagHistogram.bucket(of: range.lowerBound) == bucket)
            #expect(LagHistogram.bucket(of: range.upperBound) == bucket)
            if range.upperBound == .max {
                #expect(bucket == LagHistogram.bucketCount - 1)
                break
            }
            expectedLow = range.upperBound + 1
        }
        #expect(LagHistogram.bucket(of: .max) == LagHistogram.bucketCount - 1)
    }

    @Test("percentiles of 20 000 random lags (1 ns to 30 s, log-uniform) are within 1.6 % of the exact ones")
    func percentilesAgreeWithSorting() {
        var generator = SystemRandomNumberGenerator()
        for round in 0..<5 {
            var histogram = LagHistogram()
            var values: [Int64] = []
            for _ in 0..<20_000 {
                let value = Int64(exp(Double.random(in: 0...log(30e9), using: &generator)))
                values.append(value)
                histogram.record(value)
            }
            values.sort()
            #expect(histogram.count == 20_000)
            #expect(histogram.minimum == values.first)
            #expect(histogram.maximum == values.last)
            let exactMean = values.reduce(0) { $0 + Double($1) } / Double(values.count)
            #expect(abs(Double(histogram.mean ?? -1) - exactMean) <= 1, "\(histogram.mean ?? -1) for \(exactMean)")
            for fraction in [0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 1] {
                let exact = Self.exact(values, fraction: fraction)
                let read = histogram.value(atFraction: fraction) ?? -1
                #expect(
                    abs(Double(read - exact)) <= Double(exact) * 0.016 + 1,
                    "round \(round), fraction \(fraction): \(read) for \(exact)")
            }
        }
    }

    @Test("no value, a negative value, Int64.max and out-of-range fractions")
    func extremes() {
        var histogram = LagHistogram()
        #expect(histogram.value(atFraction: 0.5) == nil)
        let empty = StallDetector.LagSnapshot(histogram: histogram, window: 0)
        #expect(empty.count == 0 && empty.max == .zero && empty.p99 == .zero && empty.mean == .zero)
        histogram.record(-5)
        histogram.record(.max)
        #expect(histogram.minimum == 0 && histogram.maximum == .max)
        let snapshot = StallDetector.LagSnapshot(histogram: histogram, window: 1_000)
        #expect(snapshot.percentile(-3) == .zero)
        #expect(snapshot.percentile(.nan) == .zero)
        #expect(snapshot.percentile(250) == .nanoseconds(Int64.max))
        #expect(snapshot.mean > .zero)
        #expect(snapshot.description.contains("2 probes"))
    }

    @Test("mean and standard deviation are exact; a snapshot does not share buckets with the detector's")
    func meanAndDeviation() {
        var histogram = LagHistogram()
        for value: Int64 in [2_000, 4_000, 4_000, 4_000, 5_000, 5_000, 7_000, 9_000] { histogram.record(value) }
        let snapshot = StallDetector.LagSnapshot(histogram: histogram.detached(), window: 5)
        #expect(snapshot.mean == .nanoseconds(5_000))
        #expect(snapshot.standardDeviation == .nanoseconds(2_000))
        #expect(abs(Double((snapshot.p50 - .nanoseconds(4_000)).components.attoseconds)) <= 64e9, "\(snapshot.p50)")
        histogram.record(1_000_000)
        #expect(snapshot.count == 8 && snapshot.max == .nanoseconds(9_000))
    }

    /// Lags of seconds, or past 2^53 ns, that differ by a few nanoseconds: the
    /// mean and spread of the values, not of their doubles' rounding.
    @Test(
        "mean and standard deviation stay exact for long lags close together, and the mean within min...max",
        arguments: [Int64(1_000_000_000), 10_000_000_000, 100_000_000_000, 1_000_000_000_000])
    func longLagsKeepTheirSpread(base: Int64) {
        var spread = LagHistogram()
        for index in 0..<10_000 { spread.record(base + (index % 2 == 0 ? 1_000 : -1_000)) }
        let snapshot = StallDetector.LagSnapshot(histogram: spread, window: 1)
        #expect(snapshot.mean == .nanoseconds(base))
        #expect(abs(Double((snapshot.standardDeviation - .nanoseconds(1_000)).components.attoseconds)) <= 1e9)
        var equal = LagHistogram()
        for _ in 0..<10_000 { equal.record(base + 7) }
        let flat = StallDetector.LagSnapshot(histogram: equal, window: 1)
        #expect(flat.standardDeviation == .zero && flat.mean == .nanoseconds(base + 7))
        let extremes: [([Int64], Int64)] = [
            ([.max], .max), ([.max, .max], .max), ([1 << 53 + 1], 1 << 53 + 1),
            ([1 << 60 + 1, 1 << 60 + 3], 1 << 60 + 2),
        ]
        for (values, expected) in extremes {
            var histogram = LagHistogram()
            for value in values { histogram.record(value) }
            #expect(histogram.mean == expected, "\(values)")
        }
    }

    /// Four threads resetting at once, a 1 ms heartbeat: each window follows
    /// the one before, so together they never last longer than the detector.
    @Test("windows taken by concurrent resets do not overlap, and count every probe once")
    func concurrentResets() async throws {
        let queue = DispatchQueue(label: "lag-test.resets")
        let began = ContinuousClock.now
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(500), heartbeat: .milliseconds(1))
        detector.start()
        let windows = Locked<[StallDetector.LagSnapshot]>([])
        // 100 ms only: the suite's real-time tests run beside this one.
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            let end = ContinuousClock.now + .milliseconds(100)
            while ContinuousClock.now < end {
                let snapshot = detector.lagSnapshot(reset: true)
                windows.withLock { $0.append(snapshot) }
            }
        }
        detector.stop()
        let last = detector.lagSnapshot(reset: true)
        let elapsed = ContinuousClock.now - began
        let all = windows.withLock { $0 } + [last]
        let total = all.reduce(Duration.zero) { $0 + $1.window }
        #expect(total <= elapsed, "windows \(total) over \(elapsed)")
        #expect(all.filter { $0.count > 0 && $0.window == .zero }.count == 0, "windows with probes and no time")
        // Probes were answered meanwhile (on a loaded machine, maybe few).
        #expect(all.reduce(0) { $0 + $1.count } > 0)
    }

    /// A queue blocked three times for 60 ms under a 500 ms threshold: no stall,
    /// and the lag shows each block (a probe due during a block runs when it
    /// ends, at most one heartbeat after the block began).
    @Test("a detector's lag shows blocks below the threshold; reset starts an empty window; stop records no more")
    func detectorRecordsBlocks() async throws {
        let queue = DispatchQueue(label: "lag-test")
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(500), heartbeat: .milliseconds(10))
        detector.start()
        try await Task.sleep(for: .milliseconds(100))
        for _ in 0..<3 {
            queue.sync { _ = usleep(60_000) }
            try await Task.sleep(for: .milliseconds(40))
        }
        let resetAt = ContinuousClock.now
        let lag = detector.lagSnapshot(reset: true)
        #expect(lag.count >= 5, "\(lag)")
        #expect(lag.max >= .milliseconds(49), "\(lag)")
        #expect(lag.min <= lag.p50 && lag.p50 <= lag.p90 && lag.p90 <= lag.p99 && lag.p99 <= lag.p999)
        #expect(lag.p999 <= lag.max)
        #expect(lag.window >= .milliseconds(280), "\(lag)")
        let fresh = detector.lagSnapshot()
        let sinceReset = ContinuousClock.now - resetAt
        // The new window began at the reset and holds only the probes of its own
        // time (one per 10 ms heartbeat, however slow the machine made the calls).
        #expect(fresh.window <= sinceReset, "\(fresh), \(sinceReset) since the reset")
        #expect(fresh.count <= Int(fresh.window / .milliseconds(10)) + 2, "\(fresh)")
        try await Task.sleep(for: .milliseconds(60))
        detector.stop()
        let stopped = detector.lagSnapshot()
        #expect(stopped.count >= 1, "\(stopped)")
        try await Task.sleep(for: .milliseconds(60))
        #expect(detector.lagSnapshot().count == stopped.count)
    }
}
