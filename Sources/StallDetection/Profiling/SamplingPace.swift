/// When to take the next profile sample: bounded in rate and in CPU, and evenly
/// spaced, so that each function's share of the samples is its share of the time.
///
/// Samples are `minimumInterval × stride` apart, where the stride is a power of two
/// that only grows during a stall: when the recent samples (their median) cost
/// a quarter more than the budget allows at the current interval, or the
/// bucket below is overdrawn, or the profile is full, the stride
/// doubles and the profile keeps every second sample, so the samples stay evenly
/// spread (a costly phase of a stall must not get fewer samples than a cheap one).
///
/// Under that, a token bucket of CPU time guarantees the budget: it fills at
/// `budget` (``defaultBudget``, 3 %: 30 µs of CPU per millisecond) up to `burst`, each sample spends
/// what it cost, and when it is overdrawn the next sample waits until it has
/// refilled. A sample's cost is known only once it is taken, so the bucket can
/// be overdrawn by at most one sample: over any stretch of time `T` sampling
/// costs at most `budget × T + burst` of CPU, plus the cost of the one sample
/// that overdrew it, whatever a sample costs. The bucket outlives a stall:
/// stalls in a row share it.
struct SamplingPace: Sendable {
    /// The share of one core sampling may use: 3 %, and 4 % in a debug build of
    /// this package, whose unoptimized unwinder makes a sample about 5 times
    /// costlier. A sample (a capture and an unwind, naming nothing) costs
    /// 150–300 µs of CPU in release on a 2-core VM: at 3 % that is one every
    /// 10 ms, about 90 a second. In debug (about 1 ms a sample) it is one every
    /// 20 or 40 ms: a higher debug budget, with the symbol warm-up of a fresh
    /// debug process, took 10.6 % of a core over a first stall.
    static let defaultBudget: Double = {
        #if DEBUG
        return 0.04
        #else
        return 0.03
        #endif
    }()

    let minimumInterval: Int64
    let budget: Double
    let burst: Double
    /// CPU nanoseconds that may be spent now (negative: owed).
    private(set) var tokens: Double
    private var refilled: Int64?
    /// The costs of this stall's most recent typical samples, oldest first (at
    /// most ``recentCostCount``).
    private var recentCosts: [Double] = []
    /// How many recent samples judge what a sample costs: their median, so that a
    /// few costly ones (a page fault, a preemption, the work around `.started`)
    /// cannot halve the rate, while costs above the budget for most of them do.
    static let recentCostCount = 8
    /// The earliest moment the next sample may start.
    private(set) var earliest: Int64 = .min
    /// The interval between samples in effect.
    private(set) var interval: Int64

    init(
        minimumInterval: Int64 = Monotonic.nanoseconds(StallProfile.minimumInterval),
        budget: Double = SamplingPace.defaultBudget,
        burst: Int64 = 2_000_000
    ) {
        self.minimumInterval = max(1, minimumInterval)
        self.budget = min(1, max(0.0001, budget))
        self.burst = Double(max(0, burst))
        self.tokens = Double(max(0, burst))
        self.interval = self.minimumInterval
    }

    /// A new stall: its samples' cost is learnt afresh.
    mutating func beginStall() {
        recentCosts.removeAll(keepingCapacity: true)
        interval = minimumInterval
    }

    /// The interval for a stride.
    func interval(stride: Int) -> Int64 {
        let product = minimumInterval.multipliedReportingOverflow(by: Int64(max(1, stride)))
        return product.overflow ? .max / 4 : min(.max / 4, product.partialValue)
    }

    /// Records a sample that started at `start` and cost `cost` nanoseconds of
    /// CPU, taken at `stride`. Returns when the next may start, and whether the
    /// stride must double first (the samples cost more than the budget allows).
    ///
    /// A sample that had to find the blocked thread (sampling several threads)
    /// passes `typical: false`: it spends from the bucket, but does not teach the
    /// pace what a sample of this stall costs.
    mutating func sampled(start: Int64, cost: Int64, stride: Int, typical: Bool = true) -> (next: Int64, slower: Bool) {
        refill(to: start)
        let cost = Double(max(0, cost))
        tokens -= cost
        if typical {
            if recentCosts.count == Self.recentCostCount { recentCosts.removeFirst() }
            recentCosts.append(cost)
        }
        let current = interval(stride: stride)
        // A quarter over the budget is left to the bucket (which bounds the CPU
        // either way) before the rate halves: samples whose cost sits at the
        // budget line (a busy host's) would otherwise halve it in one run and not
        // the next.
        let slower = typicalCost > 1.25 * budget * Double(current) || tokens < -burst
        interval = slower ? interval(stride: stride.multipliedReportingOverflow(by: 2).partialValue) : current
        let untilRefilled = tokens >= 0 ? 0 : Int64(min(Double(Int64.max / 4), (-tokens / budget).rounded(.up)))
        let wait = max(interval, untilRefilled)
        earliest = start.addingReportingOverflow(wait).overflow ? .max : start + wait
        return (earliest, slower)
    }

    /// The median of the recent typical samples' costs once there are three
    /// (before that the bucket alone bounds the CPU); 0 before.
    private var typicalCost: Double {
        recentCosts.count < 3 ? 0 : recentCosts.sorted()[recentCosts.count / 2]
    }

    /// When a sample wanted at `now` may start.
    func next(now: Int64) -> Int64 { max(now, earliest) }

    private mutating func refill(to time: Int64) {
        if let refilled, time > refilled {
            tokens = min(burst, tokens + Double(time - refilled) * budget)
        }
        refilled = max(refilled ?? time, time)
    }
}
