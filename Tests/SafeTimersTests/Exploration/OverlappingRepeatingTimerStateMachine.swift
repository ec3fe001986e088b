@testable import SafeTimers

// The RepeatingTimer state machine as it was before the invocation gate (commit
// cc6e370), kept verbatim as a fixture: the explorer must find its overlap bug,
// which proves the explorer can find that class of bug at all.

struct OverlappingRepeatingTimerStateMachine: Sendable {
    struct Configuration: Sendable {
        /// Nanoseconds, at least ``RepeatingTimer/minimumInterval``.
        var interval: Int64
        /// `nil` for forever; never negative.
        var repetitions: Int?
        var firesImmediately: Bool
        var missedTicks: MissedTickPolicy
    }

    /// What the owner must do after an input.
    struct Action: Equatable, Sendable {
        enum Timer: Equatable, Sendable {
            case none
            case arm(Int64)
            case disarm
        }
        var timer = Timer.none
        /// Hand one invocation, tagged with the current generation, to the queue.
        var deliver = false
        /// The timer stopped (cancelled or finished): end the tick streams.
        var stopped = false
    }

    let configuration: Configuration
    private(set) var state = TimerState.idle
    private(set) var generation: UInt64 = 0
    /// Invocations begun since the last start.
    private(set) var fireCount = 0
    /// The grid point the timer is armed for.
    private(set) var nextDeadline: Int64 = 0
    /// Invocations due but not yet handed to the queue.
    private(set) var owed = 0
    /// Where this generation's invocation is, if it has one.
    enum Delivery: Sendable { case none, queued, running }
    private(set) var delivery = Delivery.none
    private var delivering: Bool { delivery != .none }
    /// Invocations handed to the queue since the last start.
    private(set) var delivered = 0

    init(configuration: Configuration) {
        self.configuration = configuration
    }

    private var remaining: Int? {
        configuration.repetitions.map { $0 - delivered - owed }
    }

    mutating func start(now: Int64) -> Action {
        switch state {
        case .running, .suspended:
            return Action()
        case .idle, .cancelled, .finished:
            break
        }
        generation &+= 1
        fireCount = 0
        delivered = 0
        owed = 0
        delivery = .none
        if let repetitions = configuration.repetitions, repetitions <= 0 {
            state = .finished
            return Action(stopped: true)
        }
        state = .running
        nextDeadline = DeadlineArithmetic.adding(configuration.interval, to: now)
        var action = Action()
        if configuration.firesImmediately {
            owed = 1
            action.deliver = takeOwed()
        }
        if remaining.map({ $0 > 0 }) ?? true {
            action.timer = .arm(nextDeadline)
        }
        return action
    }

    mutating func suspend() -> Action {
        guard state == .running else { return Action() }
        state = .suspended
        generation &+= 1
        owed = 0
        if delivery == .queued {
            // The queued invocation will not begin; it no longer counts.
            delivered -= 1
        }
        delivery = .none
        return Action(timer: .disarm)
    }

    mutating func resume(now: Int64) -> Action {
        guard state == .suspended else { return Action() }
        state = .running
        generation &+= 1
        nextDeadline = DeadlineArithmetic.adding(configuration.interval, to: now)
        return Action(timer: .arm(nextDeadline))
    }

    mutating func cancel() -> Action {
        guard state != .cancelled else { return Action() }
        state = .cancelled
        generation &+= 1
        owed = 0
        delivery = .none
        return Action(timer: .disarm, stopped: true)
    }

    /// The timer's deadline `deadline` passed; it is `now`.
    mutating func tick(deadline: Int64, now: Int64) -> Action {
        guard state == .running else { return Action() }
        let interval = configuration.interval
        let late = max(0, now &- deadline)
        let missed = Int(late / interval)  // whole intervals late
        let (step, overflow) = Int64(missed + 1).multipliedReportingOverflow(by: interval)
        nextDeadline = overflow ? DeadlineArithmetic.never : DeadlineArithmetic.adding(step, to: deadline)
        switch configuration.missedTicks {
        case .skip:
            if !delivering && owed == 0 { owed = 1 }
        case .coalesce:
            owed = max(owed, 1)
        case .catchUp(let limit):
            let (sum, overflowed) = owed.addingReportingOverflow(missed + 1)
            owed = min(overflowed ? Int.max : sum, max(limit, 1))
        }
        if let repetitions = configuration.repetitions {
            owed = min(owed, repetitions - delivered)
        }
        var action = Action()
        action.deliver = takeOwed()
        if remaining.map({ $0 > 0 }) ?? true {
            action.timer = .arm(nextDeadline)
        }
        return action
    }

    /// An invocation delivered under generation `tag` reached the queue. Returns
    /// whether it may begin (and counts it).
    mutating func beginInvocation(tag: UInt64) -> Bool {
        guard state == .running, tag == generation, delivery == .queued else { return false }
        delivery = .running
        fireCount += 1
        return true
    }

    /// An invocation that began under generation `tag` returned.
    mutating func endInvocation(tag: UInt64) -> Action {
        guard state == .running, tag == generation else { return Action() }
        delivery = .none
        var action = Action()
        action.deliver = takeOwed()
        if !action.deliver, let repetitions = configuration.repetitions, delivered >= repetitions {
            state = .finished
            generation &+= 1
            action.timer = .disarm
            action.stopped = true
        }
        return action
    }

    /// Moves one owed invocation to the queue if none is there.
    private mutating func takeOwed() -> Bool {
        guard !delivering, owed > 0 else { return false }
        owed -= 1
        delivered += 1
        delivery = .queued
        return true
    }
}
