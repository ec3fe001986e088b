import Dispatch
import Synchronization

#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The fast path of the synchronous ``withWatchdog(timeout:queue:scheduler:onTimeout:_:)``:
/// one slot per thread, in which a guarded section is a stamp, not an engine entry.
///
/// ## Design
/// A guarded section on a thread is strictly nested in the thread's own call, so
/// each thread needs one slot for its outermost section (a nested section, or
/// any other case below, takes the ordinary ``Watchdog`` path). Entering writes
/// the handler, the queue and the deadline into the thread's slot and publishes
/// them with one atomic store; leaving is one compare-and-swap. Neither takes a
/// lock nor writes a cache line another thread writes on the fast path: the slot
/// belongs to its thread.
///
/// The slot is one engine entry, armed **lazily**, as ``Watchdog/kick()`` moves
/// its entry: `armedAt` records the deadline the entry is armed at. A section
/// whose deadline is no earlier than `armedAt` arms nothing; when `armedAt`
/// passes, the scheduler thread looks at the slot: no section running → the
/// entry stays disarmed (the next section arms it, one engine lock per timeout
/// at most); a section running whose deadline is later → re-arm there; a
/// section that overran → claim it and deliver its handler. So a thread that
/// runs back-to-back 10 s sections touches the engine about once every 10 s.
///
/// Missing an overrun would need both sides to miss each other; it cannot
/// happen: the owner stores its section (`word`) then reads `armedAt`, the
/// scheduler clears `armedAt` then reads `word`, all four sequentially
/// consistent (Dekker), so at least one of them sees the other and arms.
///
/// ## The clock
/// A section reads the clock once, and that read is most of its cost, so long
/// timeouts read `CLOCK_MONOTONIC_COARSE` on Linux: the same clock as
/// ``MonotonicClock/nanoseconds()`` (`CLOCK_MONOTONIC`), as of the kernel's last
/// timekeeping tick, a fraction of the precise read's cost. `clock_getres` gives
/// its resolution (1–10 ms on Linux, by the kernel's `CONFIG_HZ`). A coarse
/// reading is behind the real time by *more* than that resolution (see
/// ``MonotonicClock/coarseNanoseconds()``). So a coarse section adds 3
/// resolutions to its deadline and is used only for timeouts of at least 250
/// resolutions: the report then comes at most 1.2 % of the timeout late, and
/// early only if the kernel's coarse clock fell more than 3 ticks behind. Shorter timeouts, and platforms without a coarse clock (Apple:
/// `CLOCK_UPTIME_RAW` is already cheap), read the precise clock and are never
/// early. A watchdog exists to notice sections that take far longer than
/// expected; a few milliseconds on a timeout of seconds do not change what it
/// reports, and a guarded section should not cost more than what it guards.
///
/// ## States (`word` = generation << 3 | phase)
/// | phase | who leaves it | how |
/// |---|---|---|
/// | idle | owner | enters a section: active |
/// | active | owner / scheduler | leaves: idle (next generation) / overran: claimed |
/// | claimed | scheduler | reads the queue, then delivered (the owner waits, briefly) |
/// | delivered | owner / job | leaves: idle, the job finds nothing to do / job begins: running |
/// | running | job / owner | handler returned: ended / owner cannot wait (a cycle of waits): abandoned |
/// | ended | owner | idle (next generation) |
/// | abandoned | job | handler returned: idle (next generation) |
///
/// `@unchecked Sendable` invariant: `handler` and `queue` are written by the
/// owner thread while the phase is idle (after an acquiring read of it: the job
/// of an abandoned section clears them, then hands the slot back with a
/// releasing store), and read by another thread only
/// after it moved the phase out of active (claimed) or delivered (running) with
/// an acquiring compare-and-swap of the same generation; the owner never writes
/// them again before it has seen the phase return to ended or been handed back
/// by the job (abandoned → idle). Everything else is atomic or immutable.
@usableFromInline
final class WatchdogSlot: TimerEntry, @unchecked Sendable {
    private enum Phase: UInt64 {
        case idle = 0, active, claimed, delivered, running, ended, abandoned
    }

    private static let phaseBits: UInt64 = 3
    private static let phaseMask: UInt64 = 0b111

    /// Keeps the fields below off the cache line of whatever the allocator put
    /// before this slot (another thread's slot, say): `word` is written twice per
    /// section, and sharing its line with another thread would make both wait.
    private let leadingPad: (Int64, Int64, Int64, Int64, Int64, Int64, Int64, Int64) = (0, 0, 0, 0, 0, 0, 0, 0)
    /// The engine this thread's slot serves (real-time engines only).
    let engine: TimerEngine
    private let word = Atomic<UInt64>(0)
    /// The running section's deadline in ticks (written by the owner while idle).
    private let deadline = Atomic<Int64>(0)
    /// The deadline the engine entry is armed at; 0 when it is not armed.
    private let armedAt = Atomic<Int64>(0)
    /// The thread running the handler (for the cycle check of a waiting owner).
    private let runner = Atomic<UInt>(0)
    /// How often the engine entry was armed (tests check that arming is lazy).
    private let armings = Atomic<Int>(0)
    /// The sequence of the current engine arming (0: none); serializes arming.
    private let arming = StateLock<UInt64>(0)
    nonisolated(unsafe) private var handler: (@Sendable () -> Void)?
    /// The section's queue, not counted: the caller of `withWatchdog` keeps it
    /// alive until the section has left, and the scheduler takes a counted
    /// reference while the section is claimed (the owner cannot leave then).
    /// Counting it here would write the queue's reference count, one cache line
    /// every thread guarding sections with that queue shares, twice per section.
    nonisolated(unsafe) private var queue: Unmanaged<DispatchQueue>?
    /// Owner only: the last timeout converted, so the common case of one timeout
    /// used again and again skips the `Duration` arithmetic.
    nonisolated(unsafe) private var lastTimeout = Duration.zero
    nonisolated(unsafe) private var lastTimeoutTicks: Int64 = 0

    /// ``MonotonicClock/coarseResolution``, and the shortest timeout measured
    /// with the coarse clock (`Int64.max`: never), kept here to spare a lazy-global check.
    private let coarseResolution: Int64
    private let coarseMinimumTimeout: Int64
    /// The scheduler whose engine this is: ``SystemTimerScheduler/shared``.
    private let scheduler: ObjectIdentifier
    /// Keeps the fields above off the cache line of whatever comes after.
    private let trailingPad: (Int64, Int64, Int64, Int64, Int64, Int64, Int64, Int64) = (0, 0, 0, 0, 0, 0, 0, 0)

    override init() {
        let shared = SystemTimerScheduler.shared
        engine = shared.engine
        scheduler = ObjectIdentifier(shared)
        let resolution = MonotonicClock.coarseResolution
        coarseResolution = resolution
        // 250 resolutions (1 s at 4 ms); no coarse clock, or a useless one: never.
        coarseMinimumTimeout = resolution > 0 && resolution <= 20_000_000 ? resolution &* 250 : Int64.max
    }

    // MARK: The owner

    /// Starts a section on the owner thread; returns its generation, or nil when
    /// the slot is busy (a nested section, or a handler of an earlier one still
    /// running): the caller then takes the ordinary path.
    @usableFromInline
    func enter(timeout: Duration, queue: DispatchQueue?, onTimeout: @escaping @Sendable () -> Void) -> UInt64? {
        // Acquiring: the phase may have been moved back to idle by another
        // thread (the job that hands an abandoned slot back clears `handler` and
        // `queue` first), and those writes must happen before ours below.
        let current = word.load(ordering: .acquiring)
        guard current & Self.phaseMask == Phase.idle.rawValue else { return nil }
        let deadline = deadline(after: timeout)
        handler = onTimeout
        self.queue = queue.map { Unmanaged.passUnretained($0) }
        self.deadline.store(deadline, ordering: .relaxed)
        let generation = current &>> Self.phaseBits
        word.store(generation &<< Self.phaseBits | Phase.active.rawValue, ordering: .sequentiallyConsistent)
        let armed = armedAt.load(ordering: .sequentiallyConsistent)
        if armed == 0 || armed > deadline { arm(deadline) }
        return generation
    }

    /// Ends the section `generation` on the owner thread. Once it returns, the
    /// handler never begins; if it was running on another thread, it has returned.
    @usableFromInline
    func leave(_ generation: UInt64) {
        let active = generation &<< Self.phaseBits | Phase.active.rawValue
        let idle = (generation &+ 1) &<< Self.phaseBits
        if word.compareExchange(expected: active, desired: idle, ordering: .acquiringAndReleasing).exchanged {
            handler = nil
            queue = nil
            return
        }
        leaveAfterOverrun(generation)
    }

    /// The section overran: its handler was claimed, delivered, is running or ran.
    private func leaveAfterOverrun(_ generation: UInt64) {
        let base = generation &<< Self.phaseBits
        let idle = (generation &+ 1) &<< Self.phaseBits
        while true {
            let current = word.load(ordering: .acquiring)
            switch Phase(rawValue: current & Self.phaseMask) {
            case .claimed:
                sched_yield()  // the scheduler is reading the queue: a few instructions
            case .delivered:
                // Revoke: the job will find another generation and not begin.
                if word.compareExchange(expected: current, desired: idle, ordering: .acquiringAndReleasing).exchanged {
                    handler = nil
                    queue = nil
                    return
                }
            case .running:
                let waited = InvocationParking.wait(forHandlerOn: runner.load(ordering: .relaxed)) {
                    word.load(ordering: .acquiring) != base | Phase.running.rawValue
                }
                if !waited {
                    // Waiting would close a cycle of waits: leave the slot to the
                    // job, which hands it back when the handler returns.
                    let abandoned = base | Phase.abandoned.rawValue
                    if word.compareExchange(
                        expected: base | Phase.running.rawValue, desired: abandoned, ordering: .acquiringAndReleasing
                    ).exchanged {
                        return
                    }
                }
            case .ended:
                handler = nil
                queue = nil
                word.store(idle, ordering: .releasing)
                return
            default:
                preconditionFailure("WatchdogSlot: phase \(current & Self.phaseMask) while leaving a section")
            }
        }
    }

    /// The deadline, in ticks, of a section of `timeout` starting now (see the
    /// clock in the type's documentation).
    @inline(__always)
    private func deadline(after timeout: Duration) -> Int64 {
        let ticks: Int64
        if timeout == lastTimeout {
            ticks = lastTimeoutTicks
        } else {
            ticks = DeadlineArithmetic.delayNanoseconds(timeout)
            lastTimeout = timeout
            lastTimeoutTicks = ticks
        }
        let start: Int64
        if ticks >= coarseMinimumTimeout {
            start = MonotonicClock.coarseNanoseconds() &- engine.origin &+ coarseResolution &* 3
        } else {
            start = MonotonicClock.nanoseconds() &- engine.origin
        }
        return DeadlineArithmetic.adding(ticks, to: start)
    }

    // MARK: The engine entry

    /// Arms the engine entry at `deadline` unless it is armed at that time or earlier.
    private func arm(_ deadline: Int64) {
        arming.withLock { sequence in
            let armed = armedAt.load(ordering: .relaxed)
            if armed != 0 && armed <= deadline { return }
            armedAt.store(deadline, ordering: .sequentiallyConsistent)
            sequence = engine.arm(self, at: deadline)
            armings.add(1, ordering: .relaxed)
        }
    }

    override func timerFired(deadline passed: Int64, sequence: UInt64, engine: TimerEngine) {
        let current = arming.withLock { armed -> Bool in
            guard armed == sequence else { return false }
            armed = 0
            armedAt.store(0, ordering: .sequentiallyConsistent)
            return true
        }
        guard current else { return }
        while true {
            let observed = word.load(ordering: .sequentiallyConsistent)
            guard observed & Self.phaseMask == Phase.active.rawValue else { return }
            let due = deadline.load(ordering: .relaxed)
            if due > passed {
                arm(due)
                return
            }
            let claimed = observed & ~Self.phaseMask | Phase.claimed.rawValue
            guard word.compareExchange(expected: observed, desired: claimed, ordering: .acquiringAndReleasing).exchanged
            else { continue }  // the section ended (or another began) meanwhile: look again
            let given = queue?.takeUnretainedValue()
            let generation = observed &>> Self.phaseBits
            word.store(observed & ~Self.phaseMask | Phase.delivered.rawValue, ordering: .releasing)
            // Made after the owner may leave again (`run` checks the generation).
            let target = given ?? HandlerExecutor.newReportQueue()
            target.async { self.run(generation) }
            return
        }
    }

    /// The delivered handler of section `generation`, on its queue.
    private func run(_ generation: UInt64) {
        let base = generation &<< Self.phaseBits
        let delivered = base | Phase.delivered.rawValue
        guard word.load(ordering: .relaxed) == delivered else { return }  // revoked: leave `runner` alone
        runner.store(ThreadIdentity.current(), ordering: .relaxed)
        guard
            word.compareExchange(
                expected: delivered, desired: base | Phase.running.rawValue, ordering: .acquiringAndReleasing
            ).exchanged
        else { return }
        var body = handler
        body?()
        body = nil  // the captures go before the run counts as ended
        _ = body
        let ended = word.compareExchange(
            expected: base | Phase.running.rawValue, desired: base | Phase.ended.rawValue,
            ordering: .acquiringAndReleasing)
        if !ended.exchanged {
            // The owner could not wait (abandoned): hand the slot back.
            handler = nil
            queue = nil
            word.store((generation &+ 1) &<< Self.phaseBits, ordering: .releasing)
        }
        InvocationParking.wakeAll()
    }

    /// Tests: how often the engine entry was armed.
    var armingCount: Int { armings.load(ordering: .relaxed) }

    /// Tests: whether no section runs and no handler of one is in flight.
    var isIdle: Bool { word.load(ordering: .acquiring) & Self.phaseMask == Phase.idle.rawValue }

    // MARK: The thread's slot

    /// The calling thread's slot, created at its first use, when `scheduler` is
    /// ``SystemTimerScheduler/shared`` (or nil, which means it); nil for any other scheduler (which then
    /// takes the ordinary path). The shared scheduler lives as long as the
    /// process, so comparing identities is enough, and costs no reference count.
    @usableFromInline
    static func current(for scheduler: (any TimerScheduler)?) -> Unmanaged<WatchdogSlot>? {
        let slot: Unmanaged<WatchdogSlot>
        if let raw = pthread_getspecific(key) { slot = Unmanaged.fromOpaque(raw) } else { slot = makeCurrent() }
        guard let scheduler else { return slot }  // nil: the shared scheduler
        let serves = slot._withUnsafeGuaranteedRef { $0.scheduler == ObjectIdentifier(scheduler) }
        return serves ? slot : nil
    }

    private static func makeCurrent() -> Unmanaged<WatchdogSlot> {
        let slot = Unmanaged.passRetained(WatchdogSlot())
        pthread_setspecific(key, slot.toOpaque())
        return slot
    }

    /// The owner thread is ending: no section can run on this slot again, so
    /// its engine entry is disarmed (otherwise it would stay armed until its
    /// deadline, forever for a timeout too long to represent, and keep the slot).
    ///
    /// The scheduler thread may be firing the entry at the same time: clearing
    /// the arming sequence under `arming` makes a firing that has not yet taken
    /// that lock a stale one, and a firing that took it first finds the phase
    /// not active (no section runs on an ending thread) and arms nothing. A
    /// handler of an abandoned section still holds the slot through its job.
    func ownerEnded() {
        arming.withLock { sequence in
            sequence = 0
            armedAt.store(0, ordering: .sequentiallyConsistent)
            engine.disarm(self)
        }
    }

    /// The thread-specific key; its destructor disarms a thread's slot and
    /// releases it when the thread ends.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let result = pthread_key_create(&key) { raw in
            #if canImport(Darwin)
            let slot = Unmanaged<WatchdogSlot>.fromOpaque(raw)
            #else
            guard let raw else { return }
            let slot = Unmanaged<WatchdogSlot>.fromOpaque(raw)
            #endif
            slot._withUnsafeGuaranteedRef { $0.ownerEnded() }
            slot.release()
        }
        precondition(result == 0, "pthread_key_create failed: \(result)")
        return key
    }()
}
