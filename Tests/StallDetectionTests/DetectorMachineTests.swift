import Testing

@testable import StallDetection

/// The detector's decisions, as a pure state machine, in virtual time
/// (milliseconds written as ms × 1e6): each phase of a stall, and random runs
/// with late looks, late samples and answers during sampling checked against what
/// a stall must lead to.
@Suite("DetectorMachine (virtual time)")
struct DetectorMachineTests {
    static let ms: Int64 = 1_000_000
    let ms = Self.ms
    let threshold = 250 * Self.ms
    let heartbeat = 25 * Self.ms

    private func running(heartbeat usesHeartbeat: Bool = true) -> DetectorMachine {
        var machine = DetectorMachine(threshold: threshold, heartbeat: heartbeat, usesHeartbeat: usesHeartbeat, now: 0)
        let begun = machine.begin()
        #expect(begun)
        let again = machine.begin()
        #expect(!again, "started once")
        let plan = machine.watch(from: 0, inRunLoopPass: false)
        #expect(plan == .keep, "the beats arm a heartbeat target's looks; an idle run loop owes nothing")
        // The first beat hands the first probe over on its grid point.
        if usesHeartbeat { machine.posted(at: heartbeat) }
        return machine
    }

    private let sample = StallBacktrace(frames: [], threadID: 7, unavailableReason: nil)

    @Test("each answer's lag is its time past the grid point it was owed from; the blocked one's is the block")
    func answersCarryTheirLag() {
        var machine = running()
        // Owed from 25 ms (the first heartbeat), answered at 25.3 ms.
        let prompt = machine.answered(at: 25 * ms + 300_000, thread: 7, queue: 1)
        #expect(prompt?.lag == 300_000)
        // Owed from 50 ms; the target was blocked until 190 ms.
        let blocked = machine.answered(at: 190 * ms, thread: 7, queue: 1)
        #expect(blocked?.lag == 140 * ms)
        #expect(blocked != nil && blocked?.outcome == nil, "under the threshold")
    }

    @Test(
        "an answer before the grid point the next is owed from answers an earlier tick: its lag counts from that tick")
    func queuedTickCarriesItsLag() {
        var machine = running()
        // Blocked until 190 ms: the 50 ms probe answers then, and the 175 ms
        // tick's probe, queued behind it, right after.
        _ = machine.answered(at: 190 * ms, thread: 7, queue: 1)
        let queued = machine.answered(at: 190 * ms + 200_000, thread: 7, queue: 1)
        #expect(queued?.lag == 15 * ms + 200_000, "due at 175 ms, not owed from 200 ms")
        // The next on its tick: from the grid point as before.
        let next = machine.answered(at: 200 * ms + 300_000, thread: 7, queue: 1)
        #expect(next?.lag == 300_000)
    }

    @Test("a probe the detector posted late: the time before its post is not the target's")
    func latePostIsNotTheTargets() {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        // Owed from 50 ms by the grid; the detector's threads waited for a core
        // and handed the probe over at 400 ms.
        machine.posted(at: 400 * ms)
        let (look, _) = machine.look(now: 420 * ms, continued: nil)
        #expect(look == .nothing, "no stall: \(look)")
        let answer = machine.answered(at: 401 * ms, thread: 7, queue: 1)
        #expect(answer?.outcome == nil, "nothing missed either")
        #expect(answer?.lag == 1 * ms, "the lag counts from the post")
    }

    @Test("a probe posted late that then blocks: the stall starts half a heartbeat before the post")
    func latePostThenBlocked() {
        var machine = running()
        _ = machine.answered(at: 100 * ms, thread: 7, queue: 1)
        machine.posted(at: 400 * ms)
        let (early, _) = machine.look(now: 600 * ms, continued: nil)
        #expect(early == .nothing)
        let (look, _) = machine.look(now: 637_500_000, continued: nil)
        guard case .sample(let decision) = look else {
            Issue.record("expected a stall to sample, got \(look)")
            return
        }
        #expect(decision.duration == 250 * ms, "from 387.5 ms")
    }

    @Test(
        "a probe posted on its grid point is owed from it; a second post before the answer is ignored; one never handed over is no stall"
    )
    func onTimePostIsOwedFromItsGridPoint() {
        var onTime = running()
        _ = onTime.answered(at: 100 * ms, thread: 7, queue: 1)
        onTime.posted(at: 125 * ms)
        onTime.posted(at: 300 * ms)  // the first is still owed: no effect
        let (a, _) = onTime.look(now: 362_500_000, continued: nil)
        guard case .sample(let decision) = a else {
            Issue.record("expected a stall to sample, got \(a)")
            return
        }
        #expect(decision.duration == 250 * ms)
        // The beat that would post was late: the target was never asked.
        var notAsked = running()
        _ = notAsked.answered(at: 100 * ms, thread: 7, queue: 1)
        let (b, plan) = notAsked.look(now: 500 * ms, continued: nil)
        #expect(b == .nothing)
        #expect(plan == .drop, "the beat that hands the probe over arms the next look")
        #expect(notAsked.settlement(now: 500 * ms) == .settled)
    }

    @Test(
        "a look while an answer that read its time earlier is being recorded opens no stall; the answer then ends none"
    )
    func answerUnderWayAtTheLook() throws {
        var machine = running()
        _ = machine.answered(at: 100 * ms, thread: 7, queue: 1)
        machine.posted(at: 125 * ms)
        // Owed from 125 ms, due at 362.5 ms. The probe read its time at 360 ms
        // and waits for the lock; the look reads 370 ms meanwhile.
        let (look, plan) = machine.look(now: 370 * ms, continued: nil, answering: true)
        #expect(look == .nothing, "the target answered before the look: \(look)")
        #expect(plan == .arm(timeout: heartbeat), "looks again should the answer be held up")
        let answered = machine.answered(at: 360 * ms, thread: 7, queue: 1)
        let answer = try #require(answered)
        #expect(answer.outcome == nil, "235 ms from the start: under the threshold, no stall at all")
        #expect(answer.look == .drop)
        // The same look with no answer under way opens the stall.
        var blocked = running()
        _ = blocked.answered(at: 100 * ms, thread: 7, queue: 1)
        blocked.posted(at: 125 * ms)
        let (opened, _) = blocked.look(now: 370 * ms, continued: nil, answering: false)
        guard case .sample = opened else {
            Issue.record("expected a stall to sample, got \(opened)")
            return
        }
    }

    @Test("an answer under way at an unconfirmed stall's second look: no `.started`, the answer makes it a missed one")
    func answerUnderWayAtTheSecondLook() throws {
        var machine = running()
        machine.posted(at: 25 * ms)
        let (first, _) = machine.look(now: 262_500_000, continued: nil)
        guard case .sample(let decision) = first else {
            Issue.record("expected a stall to sample, got \(first)")
            return
        }
        let (report, _, _) = machine.sampled(
            decision, reported: sample, samples: [:], samplingTime: 0, confirmed: false, suppressed: false)
        guard case .nothing = report else {
            Issue.record("an unconfirmed first sample reports nothing, got \(report)")
            return
        }
        let (second, _) = machine.look(now: 290 * ms, continued: nil, answering: true)
        #expect(second == .nothing, "no second look while the answer is recorded: \(second)")
        let answered = machine.answered(at: 285 * ms, thread: 7, queue: 1)
        let answer = try #require(answered)
        guard case .missed(_, let duration, _, _, _)? = answer.outcome else {
            Issue.record("expected a missed stall, got \(String(describing: answer.outcome))")
            return
        }
        #expect(duration == 272_500_000, "from 12.5 ms to the answer's own time")
    }

    @Test("healthy answers arm no look; a stall is sampled once, goes on each heartbeat, ends at the answer")
    func confirmedStall() throws {
        var machine = running()
        for beat in stride(from: Int64(25), through: 100, by: 25) {
            let answer = machine.answered(at: beat * ms, thread: 7, queue: 1)
            let step = try #require(answer)
            #expect(step.outcome == nil)
            #expect(step.look == .drop, "no look is left armed once the target answers")
            #expect(step.settled)
        }
        #expect(!machine.owesAnswer, "the next probe is owed once it is handed over, not before")
        machine.posted(at: 125 * ms)
        #expect(machine.owesAnswer, "the next probe is owed from when it is handed over")
        // The target blocks from 110 ms on: the look the beats arm runs at 362.5 ms.
        let (look, plan) = machine.look(now: 362_500_000, continued: nil)
        guard case .sample(let decision) = look else {
            Issue.record("expected a stall to sample, got \(look)")
            return
        }
        #expect(plan == .arm(timeout: heartbeat))
        #expect(decision.second == false && decision.suppressed == nil)
        #expect(decision.duration == 362_500_000 - 112_500_000, "from the midpoint of the answer and the next probe")
        #expect(!machine.owesAnswer, "a stall is open: the profiler's pre-threshold sampling ends")
        let (report, settled, _) = machine.sampled(
            decision, reported: sample, samples: [7: sample], samplingTime: ms, confirmed: true, suppressed: false)
        guard case .events(_, nil) = report else {
            Issue.record("expected .started alone, got \(report)")
            return
        }
        #expect(!settled)
        let goesOn = machine.look(now: 390 * ms, continued: nil)
        #expect(goesOn == (.stallGoesOn, .arm(timeout: heartbeat)))
        let answer = machine.answered(at: 700 * ms, thread: 7, queue: 1)
        let end = try #require(answer)
        guard case .ended(let id, let duration, _, let sampling)? = end.outcome else {
            Issue.record("expected the end, got \(String(describing: end.outcome))")
            return
        }
        #expect(id == decision.id && duration == 700 * ms - 112_500_000 && sampling == ms)
        #expect(end.settled)
    }

    @Test("a first sample that shows no job is looked at again; the second look reports it")
    func unconfirmedThenSecondLook() throws {
        var machine = running()
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        let (report, settled, _) = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        guard case .nothing = report else {
            Issue.record("an unconfirmed sample reports nothing yet, got \(report)")
            return
        }
        #expect(!settled)
        guard case (.sample(let second), .arm(let timeout)) = machine.look(now: 325 * ms, continued: nil) else {
            Issue.record("expected a second look")
            return
        }
        #expect(timeout == heartbeat)
        #expect(second.id == first.id && second.second && second.suppressed == false)
        #expect(second.duration == first.duration + 25 * ms)
        guard
            case .events(_, nil) = machine.sampled(
                second, reported: sample, samples: [:], samplingTime: ms, confirmed: true, suppressed: false
            ).report
        else {
            Issue.record("the second look reports it")
            return
        }
    }

    @Test("a second look while the executor's thread only waited for a core since the first: no report yet")
    func secondLookWhileWaitingForACore() throws {
        var machine = running()
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        let runnable = DetectorMachine.ExecutorThread(thread: 7, runnable: true, ran: 40 * ms)
        let firstConfirms = machine.confirmsWithoutJob(first, executor: runnable)
        #expect(!firstConfirms, "a first look never confirms without a job")
        _ = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        // Runnable again, 0.2 ms on a core since: waiting for one. Asked again.
        guard case (.sample(let second), _) = machine.look(now: 325 * ms, continued: nil) else {
            Issue.record("expected a second look")
            return
        }
        var waiting = runnable
        waiting.ran += 200_000
        let secondConfirms = machine.confirmsWithoutJob(second, executor: waiting)
        #expect(!secondConfirms)
        let (report, settled, _) = machine.sampled(
            second, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        guard case .nothing = report else {
            Issue.record("a second look while the thread waits for a core reports nothing, got \(report)")
            return
        }
        #expect(!settled)
        // It ran 5 ms by the next look (a job of its own, not found): reported.
        guard case (.sample(let third), _) = machine.look(now: 350 * ms, continued: nil) else {
            Issue.record("expected a third look")
            return
        }
        var ran = waiting
        ran.ran += 5 * ms
        var afterRunning = machine
        let thirdConfirms = afterRunning.confirmsWithoutJob(third, executor: ran)
        #expect(thirdConfirms)
        // Asleep at the look, or another thread, or unknown: the second look confirms as before.
        for executor in [
            DetectorMachine.ExecutorThread(thread: 7, runnable: false, ran: ran.ran),
            .init(thread: 8, runnable: true, ran: 0),
        ] {
            var other = machine
            let confirms = other.confirmsWithoutJob(third, executor: executor)
            #expect(confirms, "\(executor)")
        }
        var unknown = machine
        let unknownConfirms = unknown.confirmsWithoutJob(third, executor: nil)
        #expect(unknownConfirms)
        // The thread was sampled answering a probe: the target answered, whatever it ran.
        for executor in [ran, nil] {
            var answered = machine
            let confirms = answered.confirmsWithoutJob(third, executor: executor, answering: true)
            #expect(!confirms, "\(String(describing: executor))")
        }
    }

    @Test("an unconfirmed stall that ends before the second look is a missed stall")
    func unconfirmedThenAnswered() throws {
        var machine = running()
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        _ = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        let answer = machine.answered(at: 310 * ms, thread: 7, queue: 1)
        let step = try #require(answer)
        guard case .missed(let id, let duration, _, let processRan, _)? = step.outcome else {
            Issue.record("expected a missed stall, got \(String(describing: step.outcome))")
            return
        }
        #expect(id == first.id && duration == 310 * ms - 12_500_000)
        #expect(!processRan, "no CPU time was read")
        #expect(step.settled)
    }

    /// A machine whose probe, answered at 25 ms on thread 7, was posted at
    /// 50 ms and is overdue: the beat at 75 ms armed the look and asked for
    /// thread 7's run delay, read as 1 s. No look runs after it (the
    /// detector's threads get no core).
    private func awaitingLateAnswer() throws -> DetectorMachine {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        machine.releaseProbeSlot()
        _ = machine.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        let armed = machine.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        let plan = try #require(armed)
        let read = try #require(plan.readSchedules)
        #expect(read.threads == [7], "\(plan)")
        machine.schedulesRead([(7, .waited(1_000 * ms))], forAnswerOwedSince: read.owedSince)
        return machine
    }

    /// The missed stall an answer at 330 ms concludes, and its thread's wait
    /// for a core.
    private func missed(_ answer: DetectorMachine.Step?) throws -> (duration: Int64, waited: Int64?) {
        guard case .missed(_, let duration, _, _, let waited)? = try #require(answer).outcome else {
            Issue.record("expected a missed stall, got \(String(describing: answer?.outcome))")
            return (0, nil)
        }
        return (duration, waited)
    }

    @Test("an idle loop whose thread waited for a core to answer: no stall, though the process ran")
    func idleLoopWaitedForCore() throws {
        var machine = try awaitingLateAnswer()
        // Thread 7 answers at 330 ms: 270 ms of it waiting for a core.
        let answer = machine.answered(at: 330 * ms, thread: 7, queue: 1, schedule: .waited(1_270 * ms))
        let (duration, waited) = try missed(answer)
        #expect(waited == 270 * ms && duration >= threshold)
        #expect(
            !DetectorMachine.missedIsStall(
                duration: duration, threshold: threshold, processRan: true, sampled: true, waitedForCore: waited))
    }

    @Test("a missed stall's verdict: a stop meanwhile first, then a debugger, then the evidence")
    func missedVerdictOrder() {
        func verdict(
            continued: Int64? = nil, debugged: Bool = false, processRan: Bool = true, waited: Int64? = nil
        ) -> DetectorMachine.MissedVerdict {
            DetectorMachine.missedVerdict(
                duration: 300 * ms, now: 1_000 * ms, threshold: threshold, continued: continued, debugged: debugged,
                processRan: processRan, sampled: false, waitedForCore: waited)
        }
        #expect(verdict() == .reported)
        // A continue after the stall began: the time was the stop's.
        #expect(verdict(continued: 700 * ms, debugged: true) == .stopped)
        #expect(verdict(continued: 900 * ms, processRan: false) == .stopped)
        // One before it began concerns an earlier stop.
        #expect(verdict(continued: 699 * ms) == .reported)
        #expect(verdict(continued: 699 * ms, debugged: true, processRan: false) == .debugged)
        #expect(verdict(processRan: false) == .noEvidence)
        #expect(verdict(waited: 270 * ms) == .waitedForCore)
        #expect(verdict(processRan: false, waited: 4 * ms) == .reported)
    }

    @Test("a loop asleep in its own job, never sampled, the process idle: a stall all the same")
    func asleepInItsJob() throws {
        var machine = try awaitingLateAnswer()
        let answer = machine.answered(at: 330 * ms, thread: 7, queue: 1, schedule: .waited(1_004 * ms))
        let (duration, waited) = try missed(answer)
        #expect(waited == 4 * ms)
        #expect(
            DetectorMachine.missedIsStall(
                duration: duration, threshold: threshold, processRan: false, sampled: false, waitedForCore: waited))
    }

    @Test("a thread that ran its own job for half the threshold: its waits were the job's, and the stall counts")
    func preemptedJobIsAStall() throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        machine.releaseProbeSlot()
        _ = machine.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        let armed = machine.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        let read = try #require(armed?.readSchedules)
        machine.schedulesRead([(7, .init(ran: 100 * ms, waited: 1_000 * ms))], forAnswerOwedSince: read.owedSince)
        // A spinning job preempted on a crowded machine: 150 ms on a core and
        // 120 ms waiting, over the 280 ms until its answer.
        var spinning = machine
        let busy = spinning.answered(
            at: 330 * ms, thread: 7, queue: 1, schedule: .init(ran: 250 * ms, waited: 1_120 * ms))
        let (duration, waited) = try missed(busy)
        #expect(waited == 0, "no wait counts against a thread that ran its own job")
        #expect(
            DetectorMachine.missedIsStall(
                duration: duration, threshold: threshold, processRan: true, sampled: false, waitedForCore: waited))
        // The same wait with 2 ms on a core (the answer alone): an idle thread's.
        let idle = machine.answered(
            at: 330 * ms, thread: 7, queue: 1, schedule: .init(ran: 102 * ms, waited: 1_270 * ms))
        #expect(try missed(idle).waited == 270 * ms)
    }

    @Test("a queue's answer on another of the workers that answered before: that worker's wait is weighed")
    func otherWorkerWaitedForCore() throws {
        var machine = running()
        // Workers 7, 8 and 9 answered in turn; 9 last.
        for (index, worker) in [7, 8, 9, 8, 9].enumerated() {
            _ = machine.answered(at: Int64(5 + index) * ms, thread: Int32(worker), queue: 1)
            machine.releaseProbeSlot()
        }
        _ = machine.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        let armed = machine.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        let plan = try #require(armed)
        let read = try #require(plan.readSchedules)
        #expect(read.threads == [9, 8, 7], "the latest first, each once: \(plan)")
        // A thread the plan did not name is not kept as a baseline.
        machine.schedulesRead(
            [(9, .waited(500 * ms)), (7, .waited(1_000 * ms)), (12, .waited(0))], forAnswerOwedSince: read.owedSince)
        var byOlderWorker = machine
        let answer = byOlderWorker.answered(at: 330 * ms, thread: 7, queue: 1, schedule: .waited(1_270 * ms))
        #expect(try missed(answer).waited == 270 * ms)
        let unread = machine.answered(at: 330 * ms, thread: 12, queue: 1, schedule: .waited(270 * ms))
        #expect(try missed(unread).waited == nil, "thread 12 had not answered: its reading is no baseline")
    }

    @Test("a worker younger than the wait for the answer: its whole wait for a core is weighed; an older one's is not")
    func newWorkerWaitedForCore() throws {
        var young = try awaitingLateAnswer()
        // The answer was owed from 50 ms (the beat that posted it); at 330 ms a
        // worker started 200 ms ago answers, after 260 ms of waiting in all.
        let answer = young.answered(
            at: 330 * ms, thread: 21, queue: 1, schedule: .waited(260 * ms), threadAge: 200 * ms)
        let (duration, waited) = try missed(answer)
        #expect(waited == 260 * ms)
        #expect(
            !DetectorMachine.missedIsStall(
                duration: duration, threshold: threshold, processRan: true, sampled: false, waitedForCore: waited))
        var old = try awaitingLateAnswer()
        let byOld = old.answered(at: 330 * ms, thread: 21, queue: 1, schedule: .waited(260 * ms), threadAge: 400 * ms)
        #expect(try missed(byOld).waited == nil, "a thread older than the wait may have waited before it")
    }

    @Test("another thread's answer, a run delay that went back, or none read: no wait known, the old evidence rules")
    func waitUnknown() throws {
        var other = try awaitingLateAnswer()
        let byOther = other.answered(at: 330 * ms, thread: 8, queue: 1, schedule: .waited(1_270 * ms))
        #expect(try missed(byOther).waited == nil)
        var backwards = try awaitingLateAnswer()
        let wentBack = backwards.answered(at: 330 * ms, thread: 7, queue: 1, schedule: .waited(900 * ms))
        #expect(try missed(wentBack).waited == nil)
        var unread = try awaitingLateAnswer()
        let withoutDelay = unread.answered(at: 330 * ms, thread: 7, queue: 1)
        #expect(try missed(withoutDelay).waited == nil)
        // A reading that comes after the answer it was for is not kept for the next.
        var late = running()
        _ = late.answered(at: 25 * ms, thread: 7, queue: 1)
        late.releaseProbeSlot()
        _ = late.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        let armed = late.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        let owed = try #require(armed?.readSchedules).owedSince
        _ = late.answered(at: 80 * ms, thread: 7, queue: 1)
        late.schedulesRead([(7, .waited(1_000 * ms))], forAnswerOwedSince: owed)
        late.releaseProbeSlot()
        _ = late.beatHandingOver(at: 100 * ms, next: 125 * ms, cpu: nil, lookArmed: false)
        let next = late.answered(at: 500 * ms, thread: 7, queue: 1, schedule: .waited(1_270 * ms))
        #expect(try missed(next).waited == nil, "a baseline read for an answer already given")
        for (processRan, sampled, expected) in [(false, false, false), (true, false, true), (false, true, true)] {
            #expect(
                DetectorMachine.missedIsStall(
                    duration: 400 * ms, threshold: threshold, processRan: processRan, sampled: sampled,
                    waitedForCore: nil) == expected)
        }
    }

    @Test("an unconfirmed stall that ends before the second look carries whether the process ran meanwhile")
    func unconfirmedThenAnsweredWithCPU() throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1, cpu: 1_000 * ms)
        machine.posted(at: 50 * ms)  // the next beat hands the probe over
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        _ = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        // The spinning target answered 400 ms later, having used 300 ms of CPU.
        let answer = machine.answered(at: 425 * ms, thread: 7, queue: 1, cpu: 1_300 * ms)
        guard case .missed(let id, _, _, let processRan, _)? = try #require(answer).outcome else {
            Issue.record("expected a missed stall")
            return
        }
        #expect(id == first.id && processRan)
    }

    @Test(
        "a stack taken after the target answered is not the stall's: neither event shows it, and they say why; one taken before is shown",
        arguments: [(seenMs: Int64(330), shown: false), (seenMs: Int64(305), shown: true), (seenMs: nil, shown: true)])
    func stackSeenAfterTheAnswer(seenMs: Int64?, shown: Bool) throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        machine.posted(at: 50 * ms)  // the next beat hands the probe over
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        // The target answers at 310 ms, while its thread is searched for.
        _ = machine.answered(at: 310 * ms, thread: 7, queue: 1)
        let frame = StackFrame(
            address: 0x1000, function: "laterWork", file: nil, line: nil, image: nil, isUncertain: false)
        let later = StallBacktrace(frames: [frame], threadID: 7, unavailableReason: nil)
        let (report, _, _) = machine.sampled(
            first, reported: later, samples: [7: later], seen: seenMs.map { $0 * ms }, samplingTime: 30 * ms,
            confirmed: true, suppressed: false)
        guard case .events(let started, let ended?) = report else {
            Issue.record("expected .started and .ended, got \(report)")
            return
        }
        for backtrace in [started, ended.backtrace] {
            #expect(backtrace.frames.map(\.function) == (shown ? ["laterWork"] : []))
            #expect(
                backtrace.unavailableReason
                    == (shown ? nil : DetectorMachine.sampledAfterEnd.unavailableReason))
        }
    }

    @Test("a stall answered while sampled says when it ended (its profile ends there); one still on does not")
    func answeredWhileSamplingSaysWhen() throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        machine.posted(at: 50 * ms)  // the next beat hands the probe over
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        _ = machine.answered(at: 310 * ms, thread: 7, queue: 1)
        let (report, settled, endedAt) = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: 20 * ms, confirmed: true, suppressed: false)
        guard case .events(_, let ended?) = report else {
            Issue.record("expected .started and .ended, got \(report)")
            return
        }
        #expect(settled && endedAt == 310 * ms)
        #expect(ended.duration == first.duration + 10 * ms)

        var other = running()
        _ = other.answered(at: 25 * ms, thread: 7, queue: 1)
        other.posted(at: 50 * ms)
        guard case (.sample(let stall), _) = other.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        let open = other.sampled(
            stall, reported: sample, samples: [:], samplingTime: 20 * ms, confirmed: true, suppressed: false)
        #expect(!open.settled && open.endedAt == nil)
    }

    @Test("an unconfirmed stall that ends while its sample is taken carries whether the process ran meanwhile")
    func unconfirmedEndedWhileSampling() throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1, cpu: 1_000 * ms)
        machine.posted(at: 50 * ms)  // the next beat hands the probe over
        guard case (.sample(let first), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        let during = machine.answered(at: 310 * ms, thread: 7, queue: 1, cpu: 1_010 * ms)
        #expect(try #require(during).outcome == nil, "the sample under way concludes it")
        let (report, settled, _) = machine.sampled(
            first, reported: sample, samples: [:], samplingTime: ms, confirmed: false, suppressed: false)
        guard case .missed(.missed(let id, _, _, let processRan, _)) = report else {
            Issue.record("expected a missed stall, got \(report)")
            return
        }
        #expect(id == first.id && !processRan, "10 ms of CPU over 285 ms: under a quarter of a core")
        #expect(settled)
    }

    @Test(
        "an answer past the threshold that no look saw carries whether the process ran meanwhile (a quarter of a core)",
        arguments: [
            (cpuMs: Int64(200), expected: true),  // the process spun on most of a core
            (cpuMs: Int64(90), expected: true),  // a quarter of the 360 ms since the last answer
            (cpuMs: Int64(80), expected: false),  // less: stopped, or starved by other processes
            (cpuMs: Int64(0), expected: false),
        ])
    func missedStallCarriesProcessCPU(cpuMs: Int64, expected: Bool) throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1, cpu: 1_000 * ms)
        // No look ran (a starved detector): the next answer comes 360 ms later.
        let answer = machine.answered(at: 385 * ms, thread: 7, queue: 1, cpu: (1_000 + cpuMs) * ms)
        let step = try #require(answer)
        guard case .missed(_, let duration, _, let processRan, _)? = step.outcome else {
            Issue.record("expected a missed stall, got \(String(describing: step.outcome))")
            return
        }
        #expect(duration == 385 * ms - 37_500_000, "from the midpoint of the answer and the next probe")
        #expect(processRan == expected)
    }

    @Test(
        "a stall from the start that the first answer ends, no look having seen it, is weighed against the CPU time at the start",
        arguments: [(cpuMs: Int64(200), expected: true), (cpuMs: Int64(20), expected: false)])
    func missedFirstStallCarriesProcessCPU(cpuMs: Int64, expected: Bool) throws {
        var machine = DetectorMachine(threshold: threshold, heartbeat: heartbeat, usesHeartbeat: true, now: 0)
        _ = machine.begin()
        _ = machine.watch(from: 0, inRunLoopPass: false, cpu: 1_000 * ms)
        // The target was blocked from its first probe on (a `queue.sync` right after
        // `start()`), and the looks were late: the first answer comes at 400 ms.
        let answer = machine.answered(at: 400 * ms, thread: 7, queue: 1, cpu: (1_000 + cpuMs) * ms)
        guard case .missed(_, let duration, _, let processRan, _)? = try #require(answer).outcome else {
            Issue.record("expected a missed stall, got \(String(describing: answer?.outcome))")
            return
        }
        #expect(duration == 400 * ms - 12_500_000, "from the midpoint of the start and the first probe")
        #expect(processRan == expected)
    }

    @Test("without the process's CPU time at both answers, a missed stall has no evidence from it")
    func missedStallWithoutCPU() throws {
        var machine = running()
        _ = machine.answered(at: 25 * ms, thread: 7, queue: 1)
        let answer = machine.answered(at: 385 * ms, thread: 7, queue: 1, cpu: 10_000 * ms)
        guard case .missed(_, _, _, let processRan, _)? = try #require(answer).outcome else {
            Issue.record("expected a missed stall")
            return
        }
        #expect(!processRan)
    }

    @Test("an answer while `.started` is sampled: both events come from the sample, once")
    func endedWhileSampling() throws {
        var machine = running()
        guard case (.sample(let decision), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        let answer = machine.answered(at: 305 * ms, thread: 7, queue: 1)
        let during = try #require(answer)
        #expect(during.outcome == nil && !during.settled)
        let (report, settled, _) = machine.sampled(
            decision, reported: sample, samples: [7: sample], samplingTime: ms, confirmed: true, suppressed: false)
        guard case .events(_, let ended?) = report else {
            Issue.record("expected .started and .ended, got \(report)")
            return
        }
        #expect(ended.duration == 305 * ms - 12_500_000)
        #expect(settled)
        let later = machine.answered(at: 330 * ms, thread: 7, queue: 1)
        #expect(try #require(later).outcome == nil, "ended once")
    }

    @Test("a debugger: the stall is tracked and ends, nothing is reported")
    func suppressed() throws {
        var machine = running()
        guard case (.sample(let decision), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        guard
            case .nothing = machine.sampled(
                decision, reported: sample, samples: [:], samplingTime: 0, confirmed: true, suppressed: true
            ).report
        else {
            Issue.record("suppressed")
            return
        }
        let answer = machine.answered(at: 500 * ms, thread: 7, queue: 1)
        #expect(try #require(answer).outcome == nil)
    }

    @Test("a continue after a stop owes the answer afresh; after stop() every input does nothing")
    func continueAndStop() throws {
        var machine = running()
        // Stopped from 20 ms to 1 s: the look at 1.01 s sees the continue.
        let afterStop = machine.look(now: 1_010 * ms, continued: 1_000 * ms)
        #expect(afterStop == (.nothing, .drop), "owed afresh, due a threshold on: the beats arm it")
        #expect(machine.lastContinueSeen == 1_000 * ms)
        guard case (.sample, _) = machine.look(now: 1_300 * ms, continued: nil) else {
            Issue.record("owed from the continue on: a stall 300 ms later")
            return
        }
        let stopped = machine.stop(at: 1_350 * ms)
        #expect(stopped.wasRunning)
        #expect(stopped.cutShort == nil, "a stall being sampled emitted nothing, and ends with nothing")
        let stoppedTwice = machine.stop(at: 1_360 * ms)
        #expect(!stoppedTwice.wasRunning)
        let answer = machine.answered(at: 1_400 * ms, thread: 7, queue: 1)
        #expect(answer == nil)
        let activity = machine.activity(at: 1_400 * ms, idle: false)
        #expect(activity == nil)
        let look = machine.look(now: 1_500 * ms, continued: nil)
        #expect(look == (.nothing, .keep))
        let beat = machine.beatHandingOver(at: 1_525 * ms, next: 1_550 * ms, cpu: nil, lookArmed: false)
        #expect(beat == nil)
        #expect(!machine.owesAnswer)
    }

    @Test("a stop during a reported stall ends it: the time blocked until the stop, the stack .started showed")
    func stopEndsAReportedStall() throws {
        var machine = running()
        guard case (.sample(let decision), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        _ = machine.sampled(
            decision, reported: sample, samples: [7: sample], samplingTime: ms, confirmed: true, suppressed: false)
        let stopped = machine.stop(at: 900 * ms)
        #expect(stopped.wasRunning)
        guard case .ended(let id, let duration, let backtrace, let sampling)? = stopped.cutShort else {
            Issue.record("expected the stall cut short, got \(String(describing: stopped.cutShort))")
            return
        }
        #expect(id == decision.id)
        #expect(duration == 900 * ms - (300 * ms - decision.duration), "from the stall's start to the stop")
        #expect(backtrace.threadID == 7 && sampling == ms)
        let again = machine.stop(at: 1_000 * ms)
        #expect(!again.wasRunning && again.cutShort == nil, "ended once")
    }

    @Test("a stop during a stall reported to nobody (a debugger attached) ends nothing")
    func stopDuringASuppressedStall() {
        var machine = running()
        guard case (.sample(let decision), _) = machine.look(now: 300 * ms, continued: nil) else {
            Issue.record("expected a stall")
            return
        }
        _ = machine.sampled(
            decision, reported: sample, samples: [:], samplingTime: ms, confirmed: true, suppressed: true)
        let stopped = machine.stop(at: 900 * ms)
        #expect(stopped.wasRunning && stopped.cutShort == nil)
    }

    @Test("the run loop: started inside a pass, the pass is watched; asleep, nothing is owed")
    func runLoop() throws {
        var machine = DetectorMachine(threshold: threshold, heartbeat: heartbeat, usesHeartbeat: false, now: 0)
        let begun = machine.begin()
        #expect(begun)
        let plan = machine.watch(from: 0, inRunLoopPass: true)
        #expect(plan == .arm(timeout: threshold))
        guard case (.sample(let decision), _) = machine.look(now: threshold, continued: nil) else {
            Issue.record("the pass that called start() is watched")
            return
        }
        #expect(decision.duration == threshold)
        let asleep = machine.activity(at: 400 * ms, idle: true)
        let idle = try #require(asleep)
        #expect(idle.look == .keep)
        let look = machine.look(now: 500 * ms, continued: nil)
        #expect(look == (.nothing, .drop), "asleep: no look")
        let busyAgain = machine.activity(at: 600 * ms, idle: false)
        let busy = try #require(busyAgain)
        #expect(busy.look == .move(timeout: threshold))
    }

    @Test("one probe at a time: a beat posts only when the last probe answered or was released")
    func probeSlot() {
        var machine = running()
        let first = machine.beatHandingOver(at: 25 * ms, next: 50 * ms, cpu: nil, lookArmed: false)
        #expect(first?.post == true)
        let second = machine.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        #expect(second?.post == false, "the first is outstanding")
        machine.releaseProbeSlot()
        let third = machine.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        #expect(third?.post == true)
    }

    @Test("beats arm the look only when an answer is outstanding at a beat or due before the next; never twice")
    func beatsArmTheLook() throws {
        var machine = DetectorMachine(threshold: threshold, heartbeat: heartbeat, usesHeartbeat: true, now: 0)
        let unwatched = machine.beatHandingOver(at: 0, next: 25 * ms, cpu: nil, lookArmed: false)
        #expect(unwatched == nil, "not started")
        _ = machine.begin()
        let beforeWatch = machine.beatHandingOver(at: 0, next: 25 * ms, cpu: nil, lookArmed: false)
        #expect(beforeWatch == nil, "started, not watching yet")
        _ = machine.watch(from: 10 * ms, inRunLoopPass: false, gridStart: 0)
        // The first probe is owed from the grid's 25 ms point.
        let firstPlan = machine.beatHandingOver(at: 25 * ms, next: 50 * ms, cpu: nil, lookArmed: false)
        let first = try #require(firstPlan)
        #expect(first == .init(post: true, look: .keep))
        _ = machine.answered(at: 26 * ms, thread: 7, queue: 1)
        machine.releaseProbeSlot()
        let healthyPlan = machine.beatHandingOver(at: 50 * ms, next: 75 * ms, cpu: nil, lookArmed: false)
        let healthy = try #require(healthyPlan)
        #expect(healthy == .init(post: true, look: .keep), "answered: nothing to look at")
        // Not answered by the next beat: the look is armed for the due time,
        // a threshold after the midpoint of the answer (26 ms) and the post (50 ms).
        let latePlan = machine.beatHandingOver(at: 75 * ms, next: 100 * ms, cpu: nil, lookArmed: false)
        let late = try #require(latePlan)
        // …and the run delay of the thread that answered last is read.
        #expect(late.post == false && late.look == .arm(timeout: 288 * ms - 75 * ms))
        #expect(late.readSchedules?.threads == [7])
        let armedPlan = machine.beatHandingOver(at: 100 * ms, next: 125 * ms, cpu: nil, lookArmed: true)
        let armed = try #require(armedPlan)
        #expect(armed == .init(post: false, look: .keep), "armed once")
        let (look, plan) = machine.look(now: 288 * ms, continued: nil)
        guard case .sample = look else {
            Issue.record("expected the stall, got \(look)")
            return
        }
        #expect(plan == .arm(timeout: heartbeat))
        let duringPlan = machine.beatHandingOver(at: 300 * ms, next: 325 * ms, cpu: nil, lookArmed: false)
        let during = try #require(duringPlan)
        #expect(during.look == .keep, "a stall's looks arm themselves")
    }

    @Test("a late answer is weighed against the CPU time its probe's beat read")
    func beatReadsTheCPUBaseline() throws {
        var machine = running()
        let posted = machine.beatHandingOver(at: 25 * ms, next: 50 * ms, cpu: 1_000 * ms, lookArmed: false)
        #expect(posted?.post == true)
        #expect(!machine.needsCPU(at: 30 * ms), "a prompt answer reads no CPU time")
        #expect(machine.needsCPU(at: 400 * ms))
        let answer = machine.answered(at: 400 * ms, thread: 7, queue: 1, cpu: 1_094 * ms)
        guard case .missed(_, _, _, let processRan, _)? = try #require(answer).outcome else {
            Issue.record("expected a missed stall, got \(String(describing: answer?.outcome))")
            return
        }
        #expect(processRan, "94 ms of CPU over the 375 ms since the post: a quarter of a core")
    }

    @Test(
        "random runs: every block past threshold + heartbeat is reported once, none under threshold - heartbeat",
        arguments: 0..<200)
    func randomRuns(seed: UInt64) {
        var run = RandomRun(seed: seed, threshold: threshold, heartbeat: heartbeat)
        run.play()
        #expect(run.problems.isEmpty, "seed \(seed): \(run.problems)")
    }

    @Test(
        "random runs with probes spaced up to 4 beats while answered promptly: the same promises, fewer probes",
        arguments: 0..<200)
    func randomRunsWithIdleHeartbeat(seed: UInt64) {
        var run = RandomRun(seed: seed, threshold: threshold, heartbeat: heartbeat, widestSpacing: 4)
        run.play()
        #expect(run.problems.isEmpty, "seed \(seed): \(run.problems)")
        #expect(run.widestSpacing == 4, "seed \(seed): the probes were never spaced 4 beats apart")
    }
}

/// A heartbeat target that answers each probe within a millisecond unless
/// blocked, beats that post the probes and arm the looks, a detector whose
/// beats, looks and samples come late by random amounts (a loaded machine),
/// answers that arrive while a sample is taken, answers recorded well after
/// they read their time (looks meanwhile know one is under way), and a
/// debugger now and then.
/// Checks: each stall's events in order and once, every `.started` ended; a block
/// of threshold + heartbeat or more ends in one report (`.started` then `.ended`,
/// or a missed stall), none while a debugger is attached; `.started` while the
/// block lasts when the looks were on time; none for a block under
/// threshold − heartbeat; nothing open after the answer; no `.ended` shorter
/// than its `.started` or than the threshold. With a `widestSpacing`, healthy
/// spells are longer (the probes get spaced wider) and the same checks hold:
/// they count a block from the probe that asked it.
private struct RandomRun {
    var random: SplitMix
    let threshold: Int64
    let heartbeat: Int64
    var machine: DetectorMachine
    var problems: [String] = []
    var now: Int64 = 0
    var lookAt: Int64?
    /// A sample under way: its decision, when it completes, whether it confirms.
    var sampling: (decision: DetectorMachine.Decision, at: Int64, confirmed: Bool)?
    var started: Set<UInt64> = []
    var ended: Set<UInt64> = []
    var missed: Set<UInt64> = []
    var firstSampled: Set<UInt64> = []
    var suppressed: Set<UInt64> = []
    /// When the next beat runs, and when the outstanding probe answers (nil:
    /// none is outstanding, or the target is blocked).
    var nextBeat: Int64
    var probeOutstanding = false
    var answerAt: Int64?
    var blocked = false
    /// During a block: since when a probe has waited for the target (a late
    /// beat asks it late, and the time before is not the target's).
    var askedSince: Int64?
    /// The largest lateness of a beat or a look armed since the current block began.
    var latestLook: Int64 = 0
    var armedLateness: Int64 = 0
    var nextBeatLateness: Int64 = 0
    /// What the last answer or sample said: no stall open.
    var settled = true
    /// An answer that read its time and is recorded later (its thread waited).
    var recording: (time: Int64, at: Int64)?
    /// Each reported stall's `.started` duration.
    var startedDuration: [UInt64: Int64] = [:]
    /// The longest healthy spell, in heartbeats.
    let longestHealthy: UInt64
    /// The widest spacing of the probes so far, in beats.
    var widestSpacing: Int64 = 1

    init(seed: UInt64, threshold: Int64, heartbeat: Int64, widestSpacing: Int64 = 1) {
        random = SplitMix(seed: seed)
        self.threshold = threshold
        self.heartbeat = heartbeat
        longestHealthy = widestSpacing > 1 ? 40 : 8
        machine = DetectorMachine(
            threshold: threshold, heartbeat: heartbeat, usesHeartbeat: true, now: 0, widestSpacing: widestSpacing)
        _ = machine.begin()
        nextBeat = heartbeat
        if let plan = machine.watch(from: 0, inRunLoopPass: false, gridStart: 0) { apply(plan) }
    }

    mutating func play() {
        for _ in 0..<12 {
            let healthy = Int64(random.next() % longestHealthy + 1) * heartbeat
            run(until: now + healthy, blocked: false)
            let blockStart = now
            askedSince = probeOutstanding && recording == nil ? now : nil
            let before = (outcomes, started.count, suppressed.count)
            // A beat or a look already scheduled late counts for this block.
            latestLook = max(lookAt == nil ? 0 : armedLateness, nextBeatLateness)
            run(until: now + Int64(random.next() % UInt64(3 * threshold)), blocked: true)
            // The probe queued behind the block answers now; a sample under way
            // and the looks then finish.
            let block = now - blockStart
            let asked = askedSince.map { now - $0 } ?? 0
            let startedLive = started.count - before.1
            // The probe queued behind the block runs as soon as it ends.
            blocked = false
            if probeOutstanding && recording == nil { answer() }
            run(until: now + 2 * heartbeat + 2 * threshold, blocked: false)
            finishSampling()
            let reports = outcomes - before.0
            let hidden = suppressed.count > before.2
            let at = "a \(block / 1_000_000) ms block at \(blockStart / 1_000_000) ms"
            if asked >= threshold + heartbeat && reports != (hidden ? 0 : 1) {
                problems.append("\(at): \(reports) reports")
            }
            if block < threshold - heartbeat && (reports != 0 || hidden) { problems.append("\(at) reported") }
            // Looks on time (a sample takes up to 2 heartbeats, a second look one
            // more): `.started` comes while the block lasts.
            if asked >= threshold + 6 * heartbeat && latestLook <= 1_000_000 && !hidden && startedLive != 1 {
                problems.append("\(at), looks on time: \(startedLive) .started while it lasted")
            }
            if !settled { problems.append("\(at): still open after its answer") }
        }
        if case .ended(let id, _, _, _)? = machine.stop(at: now).cutShort { ended.insert(id) }
        if !started.isSubset(of: ended) { problems.append("started, never ended: \(started.subtracting(ended))") }
    }

    var outcomes: Int { ended.count + missed.count }

    mutating func run(until end: Int64, blocked: Bool) {
        self.blocked = blocked
        if blocked { answerAt = nil }
        while true {
            // A look waits for a sample under way (both run on the detector's thread).
            let due = sampling == nil ? lookAt : nil
            guard let next = [due, sampling?.at, answerAt, recording?.at, nextBeat].compactMap({ $0 }).min(),
                next <= end
            else { break }
            now = max(now, next)
            if let at = sampling?.at, at <= now {
                finishSampling()
            } else if let at = recording?.at, at <= now {
                recordAnswer()
            } else if sampling == nil, let at = lookAt, at <= now {
                look()
            } else if let at = answerAt, at <= now {
                answer()
            } else {
                beat()
            }
        }
        now = max(now, end)
    }

    /// A beat of the heartbeat: usually on its grid point, sometimes late by up
    /// to two thresholds (the grid points missed meanwhile are skipped).
    mutating func beat() {
        let next = (now / heartbeat + 1) * heartbeat
        let lateness = random.next() % 20 == 0 ? random.next() % UInt64(2 * threshold) : random.next() % 1_000_000
        nextBeatLateness = Int64(lateness)
        latestLook = max(latestLook, nextBeatLateness)
        nextBeat = next + nextBeatLateness
        let planned = machine.beatHandingOver(at: now, next: next, cpu: nil, lookArmed: lookAt != nil)
        guard let plan = planned else { return }
        widestSpacing = max(widestSpacing, machine.spacing.beats)
        if plan.post {
            probeOutstanding = true
            if blocked && askedSince == nil { askedSince = now }
            answerAt = blocked ? nil : now + Int64(random.next() % 1_000_000)
        }
        apply(plan.look)
    }

    /// The probe runs now and reads its time; one in four is recorded later
    /// (its thread waited for a core, or for the lock a look held).
    mutating func answer() {
        answerAt = nil
        let delay = random.next() % 4 == 0 ? Int64(random.next() % UInt64(3 * heartbeat)) : 0
        recording = (now, now + delay)
        if delay == 0 { recordAnswer() }
    }

    mutating func recordAnswer() {
        guard let (time, _) = recording.take() else { return }
        probeOutstanding = false
        defer { machine.releaseProbeSlot() }
        guard let step = machine.answered(at: time, thread: 7, queue: 1) else { return }
        record(step.outcome)
        apply(step.look)
        settled = step.settled
    }

    mutating func look() {
        lookAt = nil
        let (look, plan) = machine.look(now: now, continued: nil, answering: recording != nil)
        apply(plan)
        guard case .sample(let decision) = look else { return }
        if decision.second {
            if !firstSampled.contains(decision.id) || started.contains(decision.id) {
                problems.append("stall \(decision.id) looked at a second time out of order")
            }
        } else if !firstSampled.insert(decision.id).inserted {
            problems.append("stall \(decision.id) sampled first twice")
        }
        let delay = Int64(random.next() % UInt64(2 * heartbeat))
        // A second look needs no confirmation.
        sampling = (decision, now + delay, decision.second || random.next() % 10 < 7)
    }

    mutating func finishSampling() {
        guard case let (decision, _, confirmed)? = sampling.take() else { return }
        let sample = StallBacktrace(frames: [], threadID: 7, unavailableReason: nil)
        // A debugger attached now and then: the stall is tracked, nothing reported.
        let hidden = decision.suppressed ?? (random.next() % 10 == 0)
        if hidden { suppressed.insert(decision.id) }
        let (report, isSettled, _) = machine.sampled(
            decision, reported: sample, samples: [:], samplingTime: 0, confirmed: confirmed || hidden,
            suppressed: hidden)
        settled = isSettled
        switch report {
        case .nothing: break
        case .missed(let outcome): record(outcome)
        case .events(_, let end):
            if !started.insert(decision.id).inserted { problems.append("stall \(decision.id) started twice") }
            startedDuration[decision.id] = decision.duration
            if let end { checkEnded(decision.id, duration: end.duration) }
            if isSettled != (end != nil) { problems.append("stall \(decision.id) settled: \(isSettled)") }
        }
    }

    mutating func record(_ outcome: DetectorMachine.Outcome?) {
        switch outcome {
        case nil: break
        case .ended(let id, let duration, _, _):
            if !started.contains(id) { problems.append("stall \(id) ended before it started") }
            checkEnded(id, duration: duration)
        case .missed(let id, _, _, _, _):
            if started.contains(id) || !missed.insert(id).inserted {
                problems.append("stall \(id) missed twice or after .started")
            }
        }
    }

    mutating func markEnded(_ id: UInt64) {
        if !ended.insert(id).inserted { problems.append("stall \(id) ended twice") }
    }

    mutating func checkEnded(_ id: UInt64, duration: Int64) {
        markEnded(id)
        let started = startedDuration[id] ?? 0
        if duration < max(started, threshold) {
            problems.append("stall \(id) ended after \(duration / 1_000) µs, started at \(started / 1_000) µs")
        }
    }

    mutating func apply(_ plan: DetectorMachine.LookPlan) {
        switch plan {
        case .keep: break
        case .drop: lookAt = nil
        case .move(let timeout), .arm(let timeout):
            // The look runs late: usually a little, sometimes by more than a
            // threshold (a loaded machine).
            let lateness = random.next() % 10 == 0 ? random.next() % UInt64(2 * threshold) : random.next() % 1_000_000
            armedLateness = Int64(lateness)
            latestLook = max(latestLook, armedLateness)
            lookAt = now + timeout + Int64(lateness)
        }
    }
}

private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49EB_11B7_5133
        return z ^ (z >> 31)
    }
}

extension DetectorMachine {
    /// A beat as `DetectorCore` makes it: a probe the beat posts is handed to
    /// the target at the beat's time.
    mutating func beatHandingOver(at time: Int64, next: Int64, cpu: Int64?, lookArmed: Bool) -> BeatPlan? {
        let plan = beat(at: time, next: next, cpu: cpu, lookArmed: lookArmed)
        if plan?.post == true { posted(at: time) }
        return plan
    }
}

extension ProcessFacts.Schedule {
    /// A thread that waited `nanoseconds` for a core in all and never ran.
    static func waited(_ nanoseconds: Int64) -> Self { Self(ran: 0, waited: nanoseconds) }
}
