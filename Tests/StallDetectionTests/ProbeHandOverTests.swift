import Dispatch
import Foundation
import SafeTimers
import Testing

@testable import StallDetection

/// A probe is owed from the moment it is handed to the target, not from the
/// shared heartbeat's firing: the members that beat before it (64 detectors,
/// say), or the scheduler thread's wait for a core, come in between, and a block
/// that starts meanwhile is ahead of the probe.
@Suite("Probe hand-over")
struct ProbeHandOverTests {
    /// A heartbeat member that, once armed, spends `delay` in one beat and
    /// starts the staged block on the watched queue at its end: after the
    /// beat's time, before the detector's own beat posts its probe.
    final class SlowMember: HeartbeatMember, @unchecked Sendable {
        // `@unchecked Sendable` invariant: every stored property is a `let` of
        // a `Sendable` type; the mutable state is inside the `Locked`.
        private let stage = Locked<(@Sendable () -> Void)?>(nil)
        let delay: UInt32

        init(delay: UInt32) { self.delay = delay }

        func arm(_ block: @escaping @Sendable () -> Void) { stage.withLock { $0 = block } }

        func beat(_ beat: Heartbeat.Beat) {
            guard let block = stage.withLock({ $0.take() }) else { return }
            usleep(delay)
            block()
        }
    }

    @Test(
        "a block that starts between the heartbeat's firing and the probe's post is measured from the post",
        arguments: 0..<3)
    func blockAheadOfTheProbe(round: Int) throws {
        let heartbeat = Duration.milliseconds(25)
        let member = SlowMember(delay: 20_000)
        // Joined first: it beats before the detector in every firing.
        let shared = Heartbeat.join(
            member, period: Monotonic.nanoseconds(heartbeat), scheduler: SystemTimerScheduler.shared)
        defer { shared.leave(member) }
        let queue = DispatchQueue(label: "handover.\(round)")
        let ended = Locked<[Duration]>([])
        let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250), heartbeat: heartbeat) {
            event in
            if event.phase == .ended { ended.withLock { $0.append(event.duration) } }
        }
        detector.start()
        defer { detector.stop() }
        Thread.sleep(forTimeInterval: 0.3)
        let real = Locked<Int64>(0)
        let done = DispatchSemaphore(value: 0)
        member.arm {
            // The queue is held from the moment the block is queued (a probe
            // queued after it waits for it, whenever a worker starts it).
            let queued = Monotonic.now()
            queue.async {
                let start = Monotonic.now()
                while Monotonic.now() - start < 400_000_000 {}
                real.withLock { $0 = Monotonic.now() - queued }
                done.signal()
            }
        }
        done.wait()
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, ended.withLock({ $0.isEmpty }) { Thread.sleep(forTimeInterval: 0.02) }
        let measured = try #require(ended.withLock { $0.first }, "the 400 ms block was not reported")
        let block = Duration.nanoseconds(real.withLock { $0 })
        // Its start is known within half a heartbeat of the probe's post, and
        // its end when the probe runs: 10 ms for a worker preempted between the
        // block and the probe beside busy processes (a time slice or two). Owed
        // from the beat instead, it would be measured 20 ms longer still.
        #expect(
            measured <= block + heartbeat / 2 + .milliseconds(10),
            "a \(block) block measured \(measured): counted from before it began")
    }
}
