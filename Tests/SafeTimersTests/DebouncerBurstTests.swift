import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable import SafeTimers

/// A burst ends at its quiet period or at a flush, whatever is pending; the last
/// run of a debouncer is always its latest call, also when calls come while an
/// action runs.
@Suite("Debouncer bursts: flush ends one, the latest call runs last")
struct DebouncerBurstTests {
    /// What ran, in order.
    private final class Runs: Sendable {
        private let names = StateLock<[String]>([])
        func append(_ name: String) { names.withLock { $0.append(name) } }
        var all: [String] { names.withLock { $0 } }
    }

    @Test("a flush with nothing pending ends a leading debouncer's burst: the next call runs at once")
    func flushWithNothingPendingEndsTheBurst() {
        let manual = ManualTimerScheduler()
        let runs = Runs()
        let debouncer = Debouncer(delay: .seconds(1), leading: true, scheduler: manual)
        debouncer.call { runs.append("A") }
        manual.advance(by: .zero)
        #expect(runs.all == ["A"])
        debouncer.flush()
        debouncer.call { runs.append("B") }
        manual.advance(by: .zero)
        #expect(runs.all == ["A", "B"], "B waited for a burst that the flush had ended")
        manual.advance(by: .seconds(5))
        #expect(runs.all == ["A", "B"])
        #expect(manual.pendingCount == 0)
    }

    @Test(
        "a call due while one runs, then a new burst (leading or not): the latest call runs last, the superseded one never",
        arguments: [true, false])
    func latestCallRunsLast(leading: Bool) async {
        let queue = DispatchQueue(label: "debouncer.serial")
        let runs = Runs()
        let release = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let debouncer = Debouncer(delay: .milliseconds(30), leading: leading, queue: queue)
        debouncer.call {
            started.signal()
            release.wait()
            runs.append("A")
        }
        if !leading { debouncer.flush() }  // A runs now either way
        #expect(started.wait(timeout: .now() + 60) == .success)
        debouncer.call { runs.append("B") }
        // B's quiet period passes while A still runs.
        try? await Task.sleep(for: .milliseconds(400))
        debouncer.call {
            runs.append("C")
            done.signal()
        }
        release.signal()
        #expect(done.wait(timeout: .now() + 60) == .success)
        try? await Task.sleep(for: .milliseconds(200))
        let all = runs.all
        #expect(all.last == "C", "runs: \(all)")
        #expect(all == ["A", "C"], "B's quiet period passed while A ran, and C superseded it before it could begin")
        withExtendedLifetime(debouncer) {}
    }
}
