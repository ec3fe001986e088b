/// The pure bookkeeping of one detector: what the target last did, whether it owes
/// an answer, and whether a stall is in progress. No clock, no threads: every input
/// carries its time (monotonic nanoseconds), so the rules are tested directly.
///
/// Two kinds of evidence feed it:
/// - a heartbeat probe: ``probeSent(at:)`` when a tiny block is posted to the target,
///   ``progress(at:)`` when that block ran;
/// - a run-loop observer: ``progress(at:)`` at each run-loop activity, ``idle(at:)``
///   when the loop goes to sleep.
///
/// A stall starts when the target has owed an answer for `threshold`; it ends at the
/// next progress. An answer that comes past the threshold before any look saw
/// the stall is a stall all the same (``Event/missed(id:duration:)``). Its start is
/// estimated as the midpoint between the last progress and the moment an answer
/// became owed: exact for the run loop (the two are the same), within half a
/// heartbeat for a probe.
struct StallTracker: Sendable {
    enum Event: Equatable, Sendable {
        case started(id: UInt64, duration: Int64)
        case ended(id: UInt64, duration: Int64)
        /// The answer came `duration` after the stall's estimated start, past the
        /// threshold, and no look had seen the stall: a stall that has already
        /// ended (the detector's looks were late, on a loaded machine).
        case missed(id: UInt64, duration: Int64)
    }

    let threshold: Int64
    private(set) var lastProgress: Int64
    /// Since when the target owes an answer; nil when it owes none (idle, or answered).
    private(set) var pendingSince: Int64?
    private(set) var stall: (id: UInt64, start: Int64)?
    /// The earliest start a stall of the answer owed now is counted from
    /// (``probeSent(at:startNotBefore:)``).
    private var earliestStart = Int64.min
    private var lastID: UInt64 = 0

    init(threshold: Int64, now: Int64) {
        self.threshold = threshold
        self.lastProgress = now
    }

    var isStalled: Bool { stall != nil }

    /// A heartbeat probe was posted: from now on the target owes an answer (if it
    /// did not already). `earliest`: no stall of this answer is counted from
    /// before it. A probe posted after several beats without one (the heartbeat
    /// widened while the target answered promptly) passes the moment a beat
    /// before it: a stall that began in the gap is counted from at most half a
    /// heartbeat before the probe, as when every beat posts one, so that a
    /// block shorter than the threshold less a heartbeat is still never reported
    /// (a stall that began early in the gap is then measured short; none is
    /// measured longer than with a probe every beat).
    mutating func probeSent(at time: Int64, startNotBefore earliest: Int64 = .min) {
        guard pendingSince == nil else { return }
        pendingSince = time
        earliestStart = earliest
    }

    /// A probe was really handed to the target at `time`, while the answer was
    /// taken to be owed from a point of the timer's grid: it is owed from `time`
    /// instead. Later (the time the detector took to post was its own, not the
    /// target's), a stall's start is estimated at most half a heartbeat before
    /// it, as for a probe posted on time; earlier (seen at a 1 ms heartbeat, in
    /// 2 windows of 30; how the tick came before the projected point is not
    /// traced), a quick answer would otherwise count a lag of zero.
    mutating func probePosted(at time: Int64, heartbeat: Int64) {
        guard stall == nil, let pending = pendingSince, time != pending else { return }
        pendingSince = time
        if time > pending { lastProgress = max(lastProgress, time - heartbeat) }
    }

    /// The target did something at `time` (a probe ran, or the run loop moved on);
    /// for a run loop it is busy from then on.
    mutating func progress(at time: Int64, busyAfterwards: Bool = false) -> Event? {
        let event = finish(at: time) ?? missed(at: time)
        lastProgress = max(lastProgress, time)
        pendingSince = busyAfterwards ? time : nil
        earliestStart = .min
        return event
    }

    /// The run loop went to sleep at `time`: it owes nothing.
    mutating func idle(at time: Int64) -> Event? {
        let event = finish(at: time) ?? missed(at: time)
        lastProgress = max(lastProgress, time)
        pendingSince = nil
        earliestStart = .min
        return event
    }

    /// The detector's periodic look at the clock.
    mutating func tick(now: Int64) -> Event? {
        guard stall == nil, let pendingSince else { return nil }
        let start = estimatedStart(pendingSince: pendingSince)
        guard now - start >= threshold else { return nil }
        lastID &+= 1
        stall = (lastID, start)
        return .started(id: lastID, duration: now - start)
    }

    /// The whole process was stopped and continued at `time` (measured by
    /// ``StopWitness``); the stop began after `lastObservation`, the last moment the
    /// detector saw the process run before `time`.
    ///
    /// An answer that was owed when the process stopped is owed afresh from the
    /// continue: the target gets a whole threshold of running time to answer. An
    /// open stall loses the unobserved time, `time - lastObservation`, from its
    /// duration (which is at most one heartbeat more than the stop itself).
    mutating func continued(at time: Int64, lastObservation: Int64) {
        if let current = stall {
            let gap = max(0, time - max(lastObservation, current.start))
            stall = (current.id, current.start + gap)
        } else {
            if let pending = pendingSince { pendingSince = max(pending, time) }
            lastProgress = max(lastProgress, time)
        }
    }

    /// When a stall would start if nothing answers, or nil when nothing is owed.
    var dueTime: Int64? {
        guard stall == nil, let pendingSince else { return nil }
        return estimatedStart(pendingSince: pendingSince) + threshold
    }

    private func estimatedStart(pendingSince: Int64) -> Int64 {
        let earliest = min(max(min(lastProgress, pendingSince), earliestStart), pendingSince)
        return earliest + (pendingSince - earliest) / 2
    }

    /// A stall no look saw: nothing open, and the answer owed since before
    /// `time - threshold`.
    private mutating func missed(at time: Int64) -> Event? {
        guard stall == nil, let pendingSince else { return nil }
        let start = estimatedStart(pendingSince: pendingSince)
        guard time - start >= threshold else { return nil }
        lastID &+= 1
        return .missed(id: lastID, duration: time - start)
    }

    private mutating func finish(at time: Int64) -> Event? {
        guard let current = stall else { return nil }
        stall = nil
        return .ended(id: current.id, duration: max(0, time - current.start))
    }
}
