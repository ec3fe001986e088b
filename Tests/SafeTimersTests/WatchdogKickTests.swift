import Dispatch
import Foundation
import SafeTimersTesting
import Synchronization
import Testing

@testable @_spi(SchedulerImplementation) import SafeTimers

/// What `kick()` and `kick(timeout:)` do at, before and after the deadline, in virtual and real time.
@Suite("Watchdog kicks: refused at and after the deadline, moved at once before it")
struct WatchdogKickTests {
    @Test("A kick from a handler at the watchdog's deadline instant is refused and the watchdog fires")
    func kickAtTheDeadlineInVirtualTime() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let kicked = HandleBox<Bool>()
        let dogBox = HandleBox<Watchdog>()
        // Armed before the watchdog, so it runs first at 10 s, while the dog is still armed.
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) {
            kicked.set(dogBox.get!.kick())
            log.add("kicker")
        }
        dogBox.set(Watchdog(timeout: .seconds(10), scheduler: manual) { log.add("dog") })
        manual.advance(by: .seconds(10))
        #expect(kicked.get == false)
        #expect(log.all == ["kicker", "dog"])
    }

    @Test("A kick after a lazy re-arm, at the new deadline, is refused and the watchdog fires there")
    func kickAtTheMovedDeadline() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let dog = Watchdog(timeout: .seconds(10), scheduler: manual) { log.add("dog@\(manual.now)") }
        manual.advance(by: .seconds(5))
        #expect(dog.kick())  // deadline 15, entry still at 10
        let result = HandleBox<Bool>()
        _ = DelayedWork.schedule(after: .seconds(10), scheduler: manual) {
            result.set(dog.kick())
            log.add("kicker")
        }
        manual.advance(by: .seconds(10))
        #expect(result.get == false)
        #expect(log.all == ["kicker", "dog@15.0 seconds"])
        #expect(!dog.kick())
        #expect(!dog.kick(timeout: .seconds(100)))
    }

    @Test("Kicks with zero, negative and huge timeouts do what the docs say")
    func kickExtremes() {
        let manual = ManualTimerScheduler()
        let fired = Atomic<Int>(0)
        let dog = Watchdog(timeout: .seconds(10), scheduler: manual) { fired.add(1, ordering: .relaxed) }
        #expect(dog.kick(timeout: .seconds(Int64.max)))
        manual.advance(by: .seconds(1_000_000))
        #expect(fired.load(ordering: .relaxed) == 0)
        #expect(dog.kick(timeout: .seconds(-5)))
        manual.advance(by: .zero)
        #expect(fired.load(ordering: .relaxed) == 1)
        #expect(!dog.kick())
        #expect(manual.pendingCount == 0)
    }

    @Test(
        "In real time, a kick refused at the deadline is followed by the handler; none fires before the last kick's deadline"
    )
    func kickRaceInRealTime() async {
        var problems: [String] = []
        for round in 0..<30 {
            let scheduler = SystemTimerScheduler()
            // Make the scheduler thread busy: many works due at once.
            for _ in 0..<5_000 {
                _ = DelayedWork.schedule(after: .microseconds(500), scheduler: scheduler) {}
            }
            let firedAt = Atomic<Int64>(-1)
            let timeout = Duration.microseconds(500)
            let fired = DispatchSemaphore(value: 0)
            // The watchdog's own deadline is its creation + timeout: read before it
            // is created, as each kick's time is read before the kick (read after
            // it, a refused first kick leaves an expected deadline later than the
            // real one).
            var lastAccepted = scheduler.now
            let dog = Watchdog(timeout: timeout, scheduler: scheduler) {
                let now = scheduler.now  // one reading: seconds and attoseconds of the same moment
                firedAt.store(
                    Int64(now.components.seconds * 1_000_000_000 + now.components.attoseconds / 1_000_000_000),
                    ordering: .relaxed)
                fired.signal()
            }
            var accepted = 0
            var refusedAt: Duration?
            for _ in 0..<200_000 {
                let before = scheduler.now
                if dog.kick() {
                    lastAccepted = before
                    accepted += 1
                } else {
                    refusedAt = scheduler.now
                    break
                }
                usleep(UInt32.random(in: 0...(round % 2 == 0 ? 800 : 100)))
            }
            guard refusedAt != nil else { problems.append("round \(round): never refused"); continue }
            if fired.wait(timeout: .now() + 20) == .timedOut {
                problems.append("round \(round): refused kick but the handler never ran")
                continue
            }
            let firedNanos = firedAt.load(ordering: .relaxed)
            let earliest = lastAccepted + timeout
            let earliestNanos =
                earliest.components.seconds * 1_000_000_000 + earliest.components.attoseconds / 1_000_000_000
            if firedNanos < earliestNanos {
                problems.append(
                    "round \(round): fired \(earliestNanos - firedNanos) ns before the last accepted kick's deadline "
                        + "(\(accepted) kicks accepted)")
            }
            #expect(!dog.kick())
        }
        #expect(problems == [])
    }

    @Test("Kicks after the deadline are refused while the scheduler thread is behind, and every watchdog fires once")
    func kicksAfterDeadlineWhileSchedulerBehind() {
        for _ in 0..<3 {
            let scheduler = SystemTimerScheduler()
            let clock = ContinuousClock()
            let fired = Atomic<Int>(0)
            let timeout = Duration.milliseconds(2)
            for _ in 0..<20_000 {
                _ = DelayedWork.schedule(after: timeout, scheduler: scheduler) {}
            }
            let created = clock.now
            let dogs = (0..<2_000).map { _ in
                Watchdog(timeout: timeout, scheduler: scheduler) { fired.add(1, ordering: .relaxed) }
            }
            let armedFor = clock.now - created
            usleep(UInt32(max(0, (armedFor + timeout) / .microseconds(1))) + 1_000)
            let accepted = dogs.filter { $0.kick() }.count + dogs.filter { $0.kick(timeout: .seconds(60)) }.count
            #expect(accepted == 0)
            let start = clock.now
            while fired.load(ordering: .relaxed) < dogs.count, clock.now - start < .seconds(20) { usleep(1_000) }
            usleep(10_000)
            #expect(fired.load(ordering: .relaxed) == dogs.count)
            #expect(dogs.allSatisfy { $0.hasFired })
        }
    }

    @Test("A shorter kick(timeout:) moves the watchdog's entry at once and orders it by that move")
    func shorterKickMovesAtOnce() {
        let manual = ManualTimerScheduler()
        let log = LabelLog()
        let dog = Watchdog(timeout: .seconds(10), scheduler: manual) { log.add("dog@\(manual.now)") }
        _ = DelayedWork.schedule(after: .seconds(4), scheduler: manual) { log.add("work@4") }
        manual.advance(by: .seconds(2))
        #expect(dog.kick(timeout: .seconds(100)))
        manual.advance(by: .seconds(1))
        #expect(dog.kick(timeout: .seconds(1)))  // deadline 4, armed after work@4
        #expect(manual.pendingCount == 2)
        manual.advance(by: .seconds(10))
        #expect(log.all == ["work@4", "dog@4.0 seconds"])
        #expect(manual.pendingCount == 0)
    }

    @Test("kick() says whether it took effect: not once the deadline has passed")
    func kickReportsWhetherItTookEffect() {
        let manual = ManualTimerScheduler()
        let fired = Counter()
        let recorder = DeliveryRecorder()
        let dog = WatchdogCore.armed(
            timeout: .milliseconds(100), executor: .recorder(recorder), engine: EngineReference(manual)
        ) {
            fired.increment()
        }
        #expect(dog.kick() == true)
        manual.advance(by: .milliseconds(100))
        #expect(recorder.takeAll().count == 1, "the deadline passed: the handler is about to begin")
        #expect(dog.kick(timeout: .seconds(10)) == false)
        let watchdog = Watchdog(timeout: .seconds(1), scheduler: manual) {}
        #expect(watchdog.kick())
        watchdog.invalidate()
        #expect(!watchdog.kick())
    }
}
