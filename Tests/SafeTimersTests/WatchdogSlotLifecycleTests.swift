import Dispatch
import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// The lifecycle of a thread's `WatchdogSlot`: handed back by the job after a
/// cycle of waits, and disarmed when its thread ends. Real time, on threads or
/// queues of their own, with generous bounds.
@Suite("withWatchdog slot lifecycle (real time)")
struct WatchdogSlotLifecycleTests {
    @Test("a slot handed back by its job after a cycle of waits is reused without a data race (TSan)")
    func slotHandedBackAfterCycle() async {
        let queue = DispatchQueue(label: "slot.cycle")
        let work = Cell<DelayedWork?>(nil)
        let start = DispatchSemaphore(value: 0)
        let handlerBegan = Counter()
        let handlerReturned = Counter()
        let sameSlot = Cell<Bool>(false)
        let reused = Cell<Bool>(false)
        let finished = DispatchSemaphore(value: 0)
        work.set(
            DelayedWork.schedule(after: .zero, on: queue) {
                start.wait()
                let slot = UInt(bitPattern: WatchdogSlot.current(for: nil)!.toOpaque())
                withWatchdog(
                    timeout: .milliseconds(1),
                    onTimeout: {
                        handlerBegan.increment()
                        // Waits for the DelayedWork handler that runs the section,
                        // which waits for this: the section abandons its slot.
                        _ = work.value?.cancel()
                        handlerReturned.increment()
                    }
                ) {
                    // Overruns until the handler has begun (a report that has not
                    // begun when the section ends is dropped).
                    let deadline = ContinuousClock.now + .seconds(20)
                    while handlerBegan.count == 0 && ContinuousClock.now < deadline { usleep(1_000) }
                    usleep(20_000)  // the handler is now waiting in `cancel()`
                }
                // The next block of this serial queue runs on this thread (it keeps
                // draining the queue): it enters sections on the slot the job
                // hands back, with no other synchronization than the slot's own.
                queue.async {
                    let deadline = ContinuousClock.now + .seconds(20)
                    while handlerReturned.count == 0 && ContinuousClock.now < deadline {
                        withWatchdog(timeout: .seconds(30), onTimeout: {}) {}
                    }
                    for _ in 0..<20_000 { withWatchdog(timeout: .seconds(30), onTimeout: {}) {} }
                    let current = WatchdogSlot.current(for: nil)!
                    sameSlot.set(UInt(bitPattern: current.toOpaque()) == slot)
                    reused.set(current._withUnsafeGuaranteedRef { $0.isIdle })
                    finished.signal()
                }
            })
        start.signal()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                _ = finished.wait(timeout: .now() + 30)
                continuation.resume()
            }
        }
        #expect(handlerBegan.count == 1)
        #expect(handlerReturned.count == 1)
        #expect(sameSlot.value, "the follow-up block ran on another thread: the test did not reach the slot")
        #expect(reused.value)
    }

    @Test("a thread that ends disarms its slot's engine entry, so the slot goes with it")
    func endedThreadDisarmsItsSlot() async {
        final class Weak: @unchecked Sendable {
            // Invariant: `stored` is read and written only with `lock` held.
            private let lock = NSLock()
            private weak var stored: WatchdogSlot?
            var slot: WatchdogSlot? {
                get { lock.withLock { stored } }
                set { lock.withLock { stored = newValue } }
            }
        }
        let threads = 200
        let refs = (0..<threads).map { _ in Weak() }
        let done = Counter()
        for ref in refs {
            let thread = Thread {
                // Never fires: the entry would stay armed forever.
                withWatchdog(timeout: .seconds(Int64.max), onTimeout: {}) {}
                ref.slot = WatchdogSlot.current(for: nil)!.takeUnretainedValue()
                withWatchdog(timeout: .seconds(3_600), onTimeout: {}) {}
                done.increment()
            }
            thread.start()
        }
        await eventually { done.count == threads }
        // The slot goes once its thread's key destructor has run.
        await eventually { refs.allSatisfy { $0.slot == nil } }
        let kept = refs.filter { $0.slot != nil }.count
        #expect(kept == 0, "\(kept) of \(threads) ended threads left their slot armed in the engine")
    }
}
