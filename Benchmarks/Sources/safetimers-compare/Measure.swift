import CMallocStats
import Dispatch

/// Keeps the optimizer from deleting work whose result is unused.
@inline(never)
func blackHole<T>(_ value: T) {
    withExtendedLifetime(value) {}
}

/// Wall-clock nanoseconds per operation: the median of `rounds` rounds of
/// `iterations` calls, after one warm-up round.
func nanosecondsPerOperation(iterations: Int, rounds: Int = 5, _ body: () -> Void) -> Double {
    let clock = ContinuousClock()
    var samples: [Double] = []
    for round in 0...rounds {
        let elapsed = clock.measure {
            for _ in 0..<iterations { body() }
        }
        if round > 0 { samples.append(Double(elapsed.nanoseconds) / Double(iterations)) }
    }
    samples.sort()
    return samples[samples.count / 2]
}

/// Bytes the allocator holds, from glibc's counters.
func allocatedBytes() -> Int {
    Int(cmallocstats_allocated_bytes())
}

/// Bytes allocated per item while `count` items made by `make` are alive, and
/// bytes per item still allocated after `release` disposed of them.
func memoryPerItem<Item>(
    count: Int, make: (Int) -> Item, release: ([Item]) -> Void
) -> (perItem: Double, keptPerItem: Double) {
    Parallel.settle()  // what earlier rows left to GCD frees memory meanwhile
    var items: [Item] = []
    items.reserveCapacity(count)
    let before = allocatedBytes()
    for index in 0..<count { items.append(make(index)) }
    let during = allocatedBytes()
    release(items)
    items.removeAll(keepingCapacity: true)
    let after = allocatedBytes()
    return (Double(during - before) / Double(count), Double(max(0, after - before)) / Double(count))
}

extension Duration {
    var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
