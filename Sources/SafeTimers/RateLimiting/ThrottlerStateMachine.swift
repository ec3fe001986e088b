/// The pure state machine of a ``Throttler``: no lock, no clock, no engine.
///
/// A *window* is `interval` long and starts when a run **begins**; a run may
/// begin only once the previous window is over, and never while another runs.
///
/// | input | effects |
/// |---|---|
/// | call, window over, nothing in flight or waiting | the action is queued to run now |
/// | call otherwise | kept for the window's end (the latest call replaces the kept one, or with `latest: false` the first is kept and later ones are released); arm the window's end |
/// | deadline passed | deliver the kept action if nothing is in flight |
/// | begin (the delivered tag) | a new window starts now; the queued action is taken out to run |
/// | end | a kept action is delivered if its window is over, else the window's end is armed |
/// | cancel | release the kept and queued actions, revoke, disarm; wait for a running action on another thread |
///
/// So runs begin at least `interval` apart, never overlap, and the last call of
/// a burst always runs (at most one window, plus the running action, late).
struct ThrottlerStateMachine: GatedStateMachine, Sendable {
    /// The window length in ticks (0: no throttling beyond "no overlap").
    let interval: Int64
    /// Keep the latest call of a window (true) or the first (false).
    let keepsLatest: Bool
    /// The call kept for the end of the window.
    private var waiting: RateLimitedAction?
    /// The action the queued delivery runs.
    private var queuedAction: RateLimitedAction?
    /// When the last run began, if any.
    private(set) var lastBegin: Int64?
    /// Whether the engine entry is armed for the window's end.
    private var isArmed = false
    var gate = InvocationGate()

    init(interval: Int64, keepsLatest: Bool) {
        self.interval = interval
        self.keepsLatest = keepsLatest
    }

    /// Whether a call is kept for the window's end.
    var hasWaiting: Bool { waiting != nil }

    private func windowEnd() -> Int64 {
        guard let lastBegin else { return Int64.min }
        return DeadlineArithmetic.adding(interval, to: lastBegin)
    }

    mutating func call(_ action: RateLimitedAction, now: Int64) -> MachineEffects {
        var effects = MachineEffects()
        if waiting == nil || keepsLatest {
            effects.released = waiting?.run
            waiting = action
        } else {
            effects.released = action.run
        }
        settle(now: now, &effects)
        return effects
    }

    /// The window's end passed; it is `now`.
    mutating func deadlinePassed(now: Int64) -> MachineEffects {
        isArmed = false
        var effects = MachineEffects()
        settle(now: now, &effects)
        return effects
    }

    mutating func begin(tag: UInt64, thread: UInt, now: Int64) -> RateLimitedAction? {
        guard gate.begin(tag: tag, thread: thread) else { return nil }
        lastBegin = now
        return queuedAction.take()
    }

    mutating func end(now: Int64) -> MachineEffects {
        var effects = MachineEffects(wake: gate.end())
        settle(now: now, &effects)
        return effects
    }

    mutating func cancel(thread: UInt) -> MachineEffects {
        gate.revoke()
        var effects = MachineEffects(waitFor: gate.waitTicket(thread: thread))
        effects.preventedRun = waiting != nil || queuedAction != nil
        // Two closures may go; one travels in `released`, the other is dropped
        // here, which is outside any lock only if the caller holds none: so hand
        // both over by chaining them into one released value.
        let kept = waiting?.run
        let queued = queuedAction?.run
        waiting = nil
        queuedAction = nil
        if kept != nil || queued != nil {
            effects.released = {
                _ = kept
                _ = queued
            }
        }
        if isArmed {
            isArmed = false
            effects.timer = .disarm
        }
        return effects
    }

    /// Delivers the kept call when its window is over and nothing is in flight,
    /// otherwise makes sure the window's end is armed.
    private mutating func settle(now: Int64, _ effects: inout MachineEffects) {
        guard waiting != nil, gate.isIdle else { return }
        let end = windowEnd()
        if now >= end, let tag = gate.deliver() {
            queuedAction = waiting
            waiting = nil
            effects.deliver = tag
            effects.deliverOnMainActor = queuedAction?.onMainActor ?? false
            if isArmed {
                isArmed = false
                effects.timer = .disarm
            }
        } else if !isArmed {
            isArmed = true
            effects.timer = .arm(end)
        }
    }
}
