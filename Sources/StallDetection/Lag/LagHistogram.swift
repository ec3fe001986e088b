/// Counts lags (nanoseconds) in log-linear buckets: exact below 64 ns, then 32
/// buckets for each power of two, so a percentile read from it (a bucket's
/// middle) is within 1/64 (1.6 %) of the recorded value it stands for. Also keeps
/// the exact count, minimum and maximum, and the mean and variance of the values
/// themselves (Welford's method over each value's distance from the first, so
/// lags of seconds that differ by nanoseconds keep their spread). A pure value:
/// no lock, no clock.
///
/// Recording is a few arithmetic operations and one array write (no allocation
/// once the buckets exist: ``prepared()`` makes them ahead), so it can run under
/// the detector's lock on every probe's answer.
struct LagHistogram: Sendable, Equatable {
    /// Bits of the mantissa kept per power of two (32 buckets each).
    static let subBucketBits = 5
    static let subBuckets = 1 << subBucketBits
    /// Bucket count: 64 exact values, then 32 per power of two from 2^6 to 2^62.
    static let bucketCount = 2 * subBuckets + (62 - subBucketBits) * subBuckets

    private(set) var counts: [UInt64] = []
    private(set) var count: UInt64 = 0
    private(set) var minimum: Int64 = .max
    private(set) var maximum: Int64 = 0
    /// The first value: the others are kept as distances from it.
    private var origin: Int64 = 0
    /// The running mean of the distances from `origin`, and the sum of their
    /// squared distances from that mean (Welford).
    private var meanDistance: Double = 0
    private var squaredDeviations: Double = 0

    /// An empty histogram whose buckets are allocated (so the first record
    /// allocates nothing).
    static func prepared() -> LagHistogram {
        var histogram = LagHistogram()
        histogram.counts = Array(repeating: 0, count: bucketCount)
        return histogram
    }

    /// Records one lag; a negative one counts as zero.
    mutating func record(_ nanoseconds: Int64) {
        let value = max(0, nanoseconds)
        if counts.isEmpty { counts = Array(repeating: 0, count: Self.bucketCount) }
        counts[Self.bucket(of: value)] &+= 1
        if count == 0 { origin = value }
        count &+= 1
        minimum = min(minimum, value)
        maximum = max(maximum, value)
        // Both are non-negative: the distance cannot overflow.
        let distance = Double(value - origin)
        let delta = distance - meanDistance
        meanDistance += delta / Double(count)
        squaredDeviations += delta * (distance - meanDistance)
    }

    /// The mean, rounded to a nanosecond and kept within the minimum and
    /// maximum; nil when nothing was recorded.
    var mean: Int64? {
        guard count > 0 else { return nil }
        let offset = meanDistance.rounded()
        let whole: Int64 =
            offset >= 9.2e18 ? .max : offset <= -9.2e18 ? .min : Int64(offset)
        let (sum, overflow) = origin.addingReportingOverflow(whole)
        return overflow ? (whole > 0 ? maximum : minimum) : Swift.min(maximum, Swift.max(minimum, sum))
    }

    /// The population variance in square nanoseconds (0 when nothing was recorded).
    var variance: Double { count > 0 ? Swift.max(0, squaredDeviations / Double(count)) : 0 }

    /// A copy whose buckets share no storage with this one's.
    func detached() -> LagHistogram {
        var copy = self
        copy.counts = counts.withUnsafeBufferPointer { Array($0) }
        return copy
    }

    /// The bucket of a non-negative value.
    static func bucket(of value: Int64) -> Int {
        let unsigned = UInt64(value)
        if unsigned < UInt64(2 * subBuckets) { return Int(unsigned) }
        let exponent = 63 - unsigned.leadingZeroBitCount  // ≥ subBucketBits + 1
        let shift = exponent - subBucketBits
        let mantissa = Int(unsigned >> UInt64(shift)) - subBuckets  // 0..<subBuckets
        return (shift + 1) * subBuckets + mantissa
    }

    /// The smallest and largest value a bucket holds.
    static func range(of bucket: Int) -> ClosedRange<Int64> {
        if bucket < 2 * subBuckets { return Int64(bucket)...Int64(bucket) }
        let shift = bucket / subBuckets - 1
        let mantissa = Int64(bucket % subBuckets + subBuckets)
        let low = mantissa << Int64(shift)
        let width = Int64(1) << Int64(shift)
        let high = low > Int64.max - width ? Int64.max : low + width - 1
        return low...high
    }

    /// The value at or below which `fraction` (0...1) of the recorded values lie:
    /// the minimum or the maximum for the first and last rank, otherwise the
    /// middle of the bucket that holds that rank, kept within the minimum and
    /// maximum. Nil when nothing was recorded.
    func value(atFraction fraction: Double) -> Int64? {
        guard count > 0 else { return nil }
        let clamped = fraction.isNaN ? 0 : Swift.min(1, Swift.max(0, fraction))
        // The rank ⌈fraction × count⌉, less a hair so that 99.9 % of 1 000
        // (999.000…01 in binary floating point) is rank 999.
        let rank = Swift.max(1, UInt64((clamped * Double(count) * (1 - 1e-12)).rounded(.up)))
        if rank == 1 { return minimum }
        if rank >= count { return maximum }
        var seen: UInt64 = 0
        for (bucket, bucketCount) in counts.enumerated() where bucketCount > 0 {
            seen &+= bucketCount
            guard seen >= rank else { continue }
            let range = Self.range(of: bucket)
            let middle = range.lowerBound + (range.upperBound - range.lowerBound) / 2
            return Swift.min(maximum, Swift.max(minimum, middle))
        }
        return maximum
    }
}
