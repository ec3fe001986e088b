import SafeTimers

/// One heartbeat for every detector of the process with the same period and
/// scheduler: one engine entry (``EngineTick``) whose firing, on the scheduler
/// thread, calls each member's ``HeartbeatMember/beat(_:)`` in turn. A beat only
/// takes its detector's lock and posts (a probe to the member's target, a look
/// to its queue): no member's work runs in the beat, so a slow target holds up
/// no other member, and no thread wakes for the beat but the scheduler's.
///
/// N detectors then cost one engine firing a period, one read of the process's
/// CPU time a period, and the N probes their targets must run, instead of N
/// timers each with its own CPU read and its own look moved at every answer.
///
/// Members are held weakly; a member that leaves gets no beat once ``leave(_:)``
/// returns. The timer runs while the heartbeat has members; its grid counts
/// from ``origin``, the moment the heartbeat was made.
final class Heartbeat: Sendable {
    /// What one beat carries to each member.
    struct Beat: Sendable {
        /// When the heartbeat's handler ran (monotonic nanoseconds).
        var time: Int64
        /// When the next beat is due.
        var next: Int64
        /// The process's CPU time at `time` (``ProcessFacts/cpuTime()``).
        var cpu: Int64
    }

    private struct Key: Hashable {
        var scheduler: ObjectIdentifier
        var period: Int64
    }

    private struct Member {
        weak var member: (any HeartbeatMember)?
        var id: ObjectIdentifier
    }

    private struct State {
        var members: [Member] = []
        var tick: EngineTick?
    }

    /// Every heartbeat with members, by scheduler and period.
    private static let all = Locked<[Key: Heartbeat]>([:])

    let period: Int64
    /// The point the timer's grid counts from: the timer fires at
    /// `origin + k × period` (or later, never more than once a period).
    let origin: Int64
    private let key: Key
    private let scheduler: any TimerScheduler
    private let state = Locked(State())
    /// Held while the members beat: ``leave(_:)`` passes it once its member is
    /// out of the list, so that no beat reaches that member afterwards. Holds
    /// the number of beats so far.
    private let beating = Locked<UInt64>(0)

    private init(key: Key, scheduler: any TimerScheduler) {
        self.key = key
        self.period = key.period
        self.scheduler = scheduler
        self.origin = Monotonic.now()
    }

    /// Adds `member` to the heartbeat of `period` nanoseconds on `scheduler`
    /// (made, and its timer started, for the first member): it gets every beat
    /// from the next one on. Returns the heartbeat, for its ``origin`` and
    /// ``leave(_:)``.
    static func join(_ member: any HeartbeatMember, period: Int64, scheduler: any TimerScheduler) -> Heartbeat {
        let key = Key(scheduler: ObjectIdentifier(scheduler), period: period)
        let (heartbeat, tick) = all.withLock { all -> (Heartbeat, EngineTick?) in
            let heartbeat = all[key] ?? Heartbeat(key: key, scheduler: scheduler)
            all[key] = heartbeat
            return (heartbeat, heartbeat.add(member))
        }
        tick?.start()
        return heartbeat
    }

    /// Adds `member` (under the lock of ``all``); returns the tick to start
    /// when it is the first.
    private func add(_ member: any HeartbeatMember) -> EngineTick? {
        state.withLock { state -> EngineTick? in
            state.members.append(Member(member: member, id: ObjectIdentifier(member)))
            guard state.tick == nil else { return nil }
            let tick = EngineTick(period: .nanoseconds(period), scheduler: scheduler) { [weak self] in
                self?.beat()
            }
            state.tick = tick
            return tick
        }
    }

    /// Removes `member`. When this returns, a beat under way has finished and no
    /// later one reaches it. The last member's leave stops the timer and forgets
    /// this heartbeat (the next detector of this period starts a new one).
    func leave(_ member: any HeartbeatMember) {
        let id = ObjectIdentifier(member)
        let tick = Self.all.withLock { all in
            state.withLock { state -> EngineTick? in
                state.members.removeAll { $0.id == id || $0.member == nil }
                guard state.members.isEmpty else { return nil }
                if all[key] === self { all[key] = nil }
                return state.tick.take()
            }
        }
        tick?.cancel()
        // A beat under way finishes; later ones no longer list the member.
        beating.withLock { _ in }
    }

    /// On the scheduler thread: every member's beat, with one CPU reading.
    private func beat() {
        beating.withLock { beats in
            beats &+= 1
            let members = state.withLock { $0.members }
            let now = Monotonic.now()
            let next = origin + ((now - origin) / period + 1) * period
            let beat = Beat(time: now, next: next, cpu: ProcessFacts.cpuTime())
            for member in members { member.member?.beat(beat) }
        }
    }
}

/// A detector that the shared ``Heartbeat`` beats.
protocol HeartbeatMember: AnyObject, Sendable {
    /// On the scheduler thread: post the probe if none is outstanding, and arm
    /// the looks that are due before the next beat. Takes only its own short
    /// locks; never blocks, never calls user code.
    func beat(_ beat: Heartbeat.Beat)
}
