extension StallDetector {
    /// How long a detector's target made its probes wait, over a window: what
    /// Node's `monitorEventLoopDelay()` gives for an event loop, for any target.
    ///
    /// Each value is one probe's *lag*: from the moment the probe was handed to
    /// the target (a queue's block posted by the heartbeat; a `.custom` probe
    /// given to `post`) to the moment the target ran it. A heartbeat that fires
    /// late is the detector's lateness and is not counted. A target that keeps
    /// up shows lags from tens of microseconds (a thread's wake-up) to about a
    /// millisecond; a congested one (a long queue of short jobs) shows lags that
    /// grow with its backlog; a blocked one shows a lag as long as the block, so a stall is in
    /// the high percentiles long before an operator reads its report. For
    /// ``Target/mainRunLoop``, which has no probe, each value is the time from
    /// one run-loop activity to the next while the loop was busy.
    ///
    /// ```swift
    /// let lag = detector.lagSnapshot(reset: true)   // this window, and start a new one
    /// print("p99 \(lag.p99), max \(lag.max) over \(lag.count) probes")
    /// ```
    ///
    /// Percentiles come from a histogram with 32 buckets per power of two: each
    /// is within 1.6 % of a value the target really took, and never outside
    /// ``min``...``max``. ``count``, ``min`` and ``max`` are exact; ``mean`` (to
    /// the nanosecond, within ``min``...``max``) and ``standardDeviation`` are
    /// computed from the lags themselves in double precision, from each lag's
    /// distance to the window's first, so lags of seconds that differ by
    /// nanoseconds keep their spread. With no value recorded every duration is
    /// zero.
    public struct LagSnapshot: Sendable, Equatable, CustomStringConvertible {
        /// How many probes answered in the window.
        public let count: Int
        /// The shortest lag.
        public let min: Duration
        /// The longest lag.
        public let max: Duration
        /// The mean lag.
        public let mean: Duration
        /// The standard deviation of the lags (population).
        public let standardDeviation: Duration
        /// How long the window lasted: since the detector was created or its
        /// lag was last reset, until this snapshot.
        public let window: Duration

        let histogram: LagHistogram

        init(histogram: LagHistogram, window: Int64) {
            self.histogram = histogram
            self.window = .nanoseconds(window)
            count = Int(clamping: histogram.count)
            guard histogram.count > 0 else {
                (min, max, mean, standardDeviation) = (.zero, .zero, .zero, .zero)
                return
            }
            min = .nanoseconds(histogram.minimum)
            max = .nanoseconds(histogram.maximum)
            mean = .nanoseconds(histogram.mean ?? 0)
            standardDeviation = Self.duration(histogram.variance.squareRoot())
        }

        /// The lag that `percent` percent of the probes (0...100) did not
        /// exceed; zero when nothing was recorded. A value outside 0...100 counts as
        /// the nearer end, NaN as 0.
        public func percentile(_ percent: Double) -> Duration {
            histogram.value(atFraction: percent / 100).map { .nanoseconds($0) } ?? .zero
        }

        /// The median lag.
        public var p50: Duration { percentile(50) }
        /// The 90th percentile.
        public var p90: Duration { percentile(90) }
        /// The 99th percentile.
        public var p99: Duration { percentile(99) }
        /// The 99.9th percentile.
        public var p999: Duration { percentile(99.9) }

        /// "lag over 10.0 s: 612 probes, min 0.03 ms, p50 0.06 ms, p90 0.1 ms,
        /// p99 2.1 ms, p99.9 41.0 ms, max 41.3 ms, mean 0.2 ms".
        public var description: String {
            let parts = [
                "\(count) probes", "min \(Self.ms(min))", "p50 \(Self.ms(p50))", "p90 \(Self.ms(p90))",
                "p99 \(Self.ms(p99))", "p99.9 \(Self.ms(p999))", "max \(Self.ms(max))", "mean \(Self.ms(mean))",
            ]
            return "lag over \(Self.seconds(window)): " + parts.joined(separator: ", ")
        }

        private static func duration(_ nanoseconds: Double) -> Duration {
            nanoseconds.isFinite ? .nanoseconds(Int64(Swift.min(nanoseconds, 9.2e18).rounded())) : .zero
        }

        private static func ms(_ duration: Duration) -> String {
            let value = Double(duration.components.seconds) * 1e3 + Double(duration.components.attoseconds) / 1e15
            return value < 10 ? "\((value * 100).rounded() / 100) ms" : "\((value * 10).rounded() / 10) ms"
        }

        private static func seconds(_ duration: Duration) -> String {
            let value = Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
            return "\((value * 10).rounded() / 10) s"
        }
    }
}
