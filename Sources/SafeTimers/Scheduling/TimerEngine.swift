#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The machinery behind every scheduler: a heap of armed entries, a lock, and
/// either a real clock with one tickless thread (``SystemTimerScheduler``) or a
/// virtual clock advanced by hand (`ManualTimerScheduler` in `SafeTimersTesting`).
///
/// Both kinds share the heap, the ordering rules (deadline, then arming order) and
/// the arm/disarm paths, so what a test proves under virtual time is the code that
/// runs in production.
///
/// Time is kept as `Int64` nanoseconds since the engine was created ("ticks").
///
/// `@unchecked Sendable` invariant: every mutable stored property lives in
/// `state`, which is read and written only while `lock` is held; the remaining
/// properties are immutable after `init`.
@_spi(SchedulerImplementation)
public final class TimerEngine: @unchecked Sendable {
    /// Mutable engine state; touched only with `lock` held.
    private struct State {
        var heap = TimerHeap()
        var lastSequence: UInt64 = 0
        /// Virtual clock (manual engines only).
        var virtualNow: Int64 = 0
        /// What the scheduler thread waits for: `Int64.min` while it is awake (it
        /// will look at the heap again before sleeping, so nobody needs to wake
        /// it), otherwise the deadline it sleeps until (`never` when untimed).
        var sleepingUntil = Int64.min
        var threadStarted = false
        var schedulerThreadID: Int32 = 0
        var shuttingDown = false
        /// Scheduler-thread wake-ups, counted for tests and benchmarks.
        var wakeUps = 0
    }

    private let lock = ConditionLock()
    private var state = State()
    private let origin: Int64
    /// `true` for a manual engine: entries fire synchronously inside `advance(by:)`
    /// and primitives run their handlers inline instead of on their queue.
    let isVirtual: Bool

    /// The most entries the scheduler thread takes out of the heap per lock hold,
    /// so arming threads never wait behind a long batch.
    private static let batchLimit = 256

    /// Creates an engine. A real-time engine starts its thread at the first arm.
    public init(virtual: Bool) {
        isVirtual = virtual
        origin = virtual ? 0 : MonotonicClock.nanoseconds()
    }

    /// The current time in ticks.
    @inline(__always)
    var nowTicks: Int64 {
        if isVirtual { return lock.withLock { state.virtualNow } }
        return MonotonicClock.nanoseconds() &- origin
    }

    /// The current time as a `Duration` since the engine was created.
    public var now: Duration { .nanoseconds(nowTicks) }

    /// How many entries are armed.
    public var pendingCount: Int { lock.withLock { state.heap.count } }

    /// The Linux thread id of the scheduler thread, or 0 before it started.
    public var schedulerThreadID: Int32 { lock.withLock { state.schedulerThreadID } }

    /// How often the scheduler thread woke up (from a timed wait or a signal).
    public var wakeUpCount: Int { lock.withLock { state.wakeUps } }

    /// Arms `entry` at `deadline` (ticks), moving it if it is armed already.
    ///
    /// Returns the arming's sequence number: ``TimerEntry/timerFired(deadline:sequence:engine:)``
    /// receives it back, so an entry can ignore a firing that belongs to an arming
    /// it has since replaced. A deadline of ``DeadlineArithmetic/never`` keeps the
    /// entry pending without ever waking the scheduler thread; a deadline in the
    /// past fires as soon as possible.
    ///
    /// - Complexity: O(log n); wakes the scheduler thread only when `deadline` is
    ///   earlier than the one it sleeps until.
    @discardableResult
    func arm(_ entry: any TimerEntry, at deadline: Int64) -> UInt64 {
        lock.lock()
        defer { lock.unlock() }
        state.lastSequence &+= 1
        let sequence = state.lastSequence
        let index = entry.heapIndex
        if index >= 0 {
            state.heap.update(at: index, deadline: deadline, sequence: sequence)
        } else {
            state.heap.insert(entry, deadline: deadline, sequence: sequence)
        }
        if !isVirtual {
            if !state.threadStarted {
                state.threadStarted = true
                startThread()
            } else if deadline < state.sleepingUntil {
                state.sleepingUntil = Int64.min
                lock.signal()
            }
        }
        return sequence
    }

    /// Removes `entry` from the heap if it is armed; returns whether it was.
    ///
    /// The engine drops its reference to the entry before returning. It never
    /// wakes the scheduler thread: if the entry was the earliest, the thread may
    /// wake once at that deadline, find nothing due and sleep again.
    ///
    /// - Complexity: O(log n)
    @discardableResult
    func disarm(_ entry: any TimerEntry) -> Bool {
        lock.lock()
        let index = entry.heapIndex
        var removed: TimerHeap.Element? = nil
        if index >= 0 {
            removed = state.heap.remove(at: index)
        }
        lock.unlock()
        // `removed` (and with it possibly the last reference to the entry) is
        // released here, outside the lock.
        return removed != nil
    }

    // MARK: Virtual time

    /// Moves the virtual clock forward by `duration`, firing every entry that falls
    /// due, in deadline order (ties in arming order), synchronously on this thread,
    /// including entries armed by those firings when they fall due within the
    /// advance. A non-positive `duration` fires only what is already due.
    public func advance(by duration: Duration) {
        precondition(isVirtual, "advance(by:) needs a manual engine")
        let target = lock.withLock {
            DeadlineArithmetic.deadline(now: state.virtualNow, after: duration)
        }
        advance(toTicks: target)
    }

    /// Moves the virtual clock to `instant` (time since the engine was created;
    /// never backwards, saturating), firing as ``advance(by:)`` does.
    public func advance(to instant: Duration) {
        advance(toTicks: max(0, DeadlineArithmetic.nanoseconds(instant)))
    }

    /// Moves the virtual clock to `target` ticks (never backwards), firing as
    /// ``advance(by:)`` does.
    public func advance(toTicks target: Int64) {
        precondition(isVirtual, "advance(to:) needs a manual engine")
        while true {
            lock.lock()
            guard let first = state.heap.first, first.deadline <= target, first.deadline != DeadlineArithmetic.never
            else {
                state.virtualNow = max(state.virtualNow, target)
                lock.unlock()
                return
            }
            let element = state.heap.removeFirst()
            state.virtualNow = max(state.virtualNow, element.deadline)
            lock.unlock()
            element.entry.timerFired(deadline: element.deadline, sequence: element.sequence, engine: self)
        }
    }

    /// The earliest armed deadline in ticks, if any.
    public var nextDeadline: Int64? { lock.withLock { state.heap.first?.deadline } }

    // MARK: The scheduler thread

    /// Stops the scheduler thread and drops every armed entry.
    public func shutDown() {
        lock.lock()
        state.shuttingDown = true
        let dropped = state.heap.elements
        state.heap.removeAll()
        lock.signal()
        lock.unlock()
        _ = dropped  // released outside the lock
    }

    /// When the scheduler thread must wake next, in ticks (lock held).
    ///
    /// The earliest entry may be fired up to its leeway late, so the thread sleeps
    /// until `first.deadline + first.leeway`, but never past the next deadline in
    /// the heap: every other entry's deadline is at least that one, so no entry is
    /// ever fired after its own deadline plus its own leeway, and entries due in
    /// the window share one wake-up.
    private func wakeUpTarget() -> Int64 {
        guard let first = state.heap.first else { return DeadlineArithmetic.never }
        let leeway = first.entry.leewayTicks
        guard leeway > 0 else { return first.deadline }
        let relaxed = DeadlineArithmetic.adding(leeway, to: first.deadline)
        return min(relaxed, state.heap.secondDeadline ?? relaxed)
    }

    private func startThread() {
        // The thread keeps the engine alive until `shutDown()` lets it end.
        NamedThread.start(name: "SafeTimers") { [self] in self.runSchedulerThread() }.detach()
    }

    private func runSchedulerThread() {
        var batch: [TimerHeap.Element] = []
        batch.reserveCapacity(Self.batchLimit)
        lock.lock()
        state.schedulerThreadID = ThreadIdentity.currentKernelThreadID()
        while !state.shuttingDown {
            let now = MonotonicClock.nanoseconds() &- origin
            while batch.count < Self.batchLimit, let first = state.heap.first, first.deadline <= now {
                batch.append(state.heap.removeFirst())
            }
            if !batch.isEmpty {
                lock.unlock()
                for element in batch {
                    element.entry.timerFired(deadline: element.deadline, sequence: element.sequence, engine: self)
                }
                batch.removeAll(keepingCapacity: true)
                lock.lock()
                continue
            }
            let earliest = wakeUpTarget()
            let absolute = DeadlineArithmetic.adding(earliest, to: origin)
            if earliest == DeadlineArithmetic.never || absolute == DeadlineArithmetic.never {
                state.sleepingUntil = DeadlineArithmetic.never
                lock.wait()
            } else {
                state.sleepingUntil = earliest
                lock.wait(untilMonotonic: absolute)
            }
            state.sleepingUntil = Int64.min
            state.wakeUps += 1
        }
        lock.unlock()
    }
}
