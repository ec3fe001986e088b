import Foundation
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// A minimal entry for driving the engine directly: records each firing and
/// holds a payload that weak probes can watch.
final class RecordingEntry: TimerEntry, @unchecked Sendable {
    let name: String
    /// The arming this entry answers to; held while arming so a firing cannot
    /// overtake the bookkeeping (the same discipline the primitives follow).
    private let armedSequence = StateLock<UInt64>(0)
    let payload: StateLock<Probe?>
    private let onFire: @Sendable (String, Int64) -> Void

    init(_ name: String, payload: Probe? = nil, onFire: @escaping @Sendable (String, Int64) -> Void = { _, _ in }) {
        self.name = name
        self.payload = StateLock(payload)
        self.onFire = onFire
    }

    func arm(_ engine: TimerEngine, at deadline: Int64) {
        armedSequence.withLock { $0 = engine.arm(self, at: deadline) }
    }

    func cancel(_ engine: TimerEngine) -> Bool {
        let removed = armedSequence.withLock {
            $0 = 0
            return engine.disarm(self)
        }
        payload.withLock { $0 = nil }
        return removed
    }

    override func timerFired(deadline: Int64, sequence: UInt64, engine: TimerEngine) {
        guard armedSequence.withLock({ $0 }) == sequence else { return }
        onFire(name, deadline)
    }
}

/// A thread-safe log of what fired, in order.
final class FireLog: Sendable {
    private let entries = StateLock<[String]>([])
    func record(_ name: String) { entries.withLock { $0.append(name) } }
    var names: [String] { entries.withLock { $0 } }
    var count: Int { entries.withLock { $0.count } }
}

final class Probe: Sendable {}

/// A counter that closures of any isolation can share.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() { value.add(1, ordering: .relaxed) }
    var count: Int { value.load(ordering: .relaxed) }
}

// MARK: Polling real time

/// Polls `condition` on this thread until it holds or 20 s pass (a bound no
/// healthy run reaches).
func waitUntil(_ condition: () -> Bool) {
    let deadline = ContinuousClock.now + .seconds(20)
    while !condition() && ContinuousClock.now < deadline { usleep(500) }
}

/// Polls `condition` until it holds or `seconds` pass, suspending between polls:
/// it holds no Dispatch worker (on Linux the Swift concurrency pool *is*
/// Dispatch's, two threads on two cores, and ThreadSanitizer or parallel suites can
/// starve the polling task for seconds). Returns whether it held.
@discardableResult
func eventually(
    within seconds: Double = 20, isolation: isolated (any Actor)? = #isolation, _ condition: () -> Bool
) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return condition()
}

/// A log of labels, in the order handlers ran.
final class LabelLog: Sendable {
    let entries = StateLock<[String]>([])
    func add(_ label: String) { entries.withLock { $0.append(label) } }
    var all: [String] { entries.withLock { $0 } }
}

/// The indexes of the calls that ran, in order (a class: a `Mutex` captured by an
/// escaping closure is a boxed variable, whose `withLock` ThreadSanitizer counts as a
/// modifying access of the box).
final class CallIndexLog: Sendable {
    let entries = StateLock<[Int]>([])
    func add(_ index: Int) { entries.withLock { $0.append(index) } }
    var all: [Int] { entries.withLock { $0 } }
}

/// Holds handles made inside handlers.
final class HandleBox<Value: Sendable>: Sendable {
    let value = StateLock<Value?>(nil)
    func set(_ new: Value) { value.withLock { $0 = new } }
    var get: Value? { value.withLock { $0 } }
}

/// Flags shared between a test's threads and tasks.
final class SharedFlags: Sendable {
    let stop = Atomic<Bool>(false)
    let lowest = Atomic<Int>(0)
}

/// Counts handler invocations in flight and remembers the most at once.
final class InvocationOverlap: Sendable {
    private let state = StateLock((current: 0, most: 0, finished: 0))
    func enter() {
        state.withLock {
            $0.current += 1; $0.most = max($0.most, $0.current)
        }
    }
    func leave() {
        state.withLock {
            $0.current -= 1; $0.finished += 1
        }
    }
    var current: Int { state.withLock { $0.current } }
    var most: Int { state.withLock { $0.most } }
    var finished: Int { state.withLock { $0.finished } }
}
