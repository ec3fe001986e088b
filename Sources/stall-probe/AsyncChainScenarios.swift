import Dispatch
import Foundation
import StallDetection

// Stalls inside async code: `async-chain <target> [depth]` blocks 600 ms at the
// end of a chain of awaits, route → middleware → `depth` levels (default 1) →
// handler → blocker, where every level first awaits `Task.yield()` (so each
// runs as a resumed partial function) and then awaits the next. Targets:
//   queue    an actor whose executor is a serial dispatch queue, watched as `.queue`
//   custom   the same actor, watched as `.custom` through its queue
//   pool     a task on the cooperative pool, every pool thread blocked, `.cooperativePool`
//   main     the main actor under an async entry point, `.mainQueue`
//   group    a task group's child task on the actor
//   asynclet an `async let` child task on the actor
//   actors   the actor awaits a second actor (on its own queue) that blocks
// Extra output line, one per event:
//   ASYNC <phase> <task name or -> <the report's frames, one name each, `|`-separated>

/// Where an async chain's blocker runs: a serial dispatch queue as an actor's executor.
final class QueueExecutor: SerialExecutor {
    let queue: DispatchQueue

    init(label: String) { queue = DispatchQueue(label: label) }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

/// The blocking call at the end of every chain.
@inline(never)
func asyncChainBlocker(_ milliseconds: Int) {
    let end = ContinuousClock.now + .milliseconds(milliseconds)
    while ContinuousClock.now < end { usleep(5_000) }
}

actor ChainActor {
    let executor: QueueExecutor
    let next: ChainActor?

    init(label: String, next: ChainActor? = nil) {
        executor = QueueExecutor(label: label)
        self.next = next
    }

    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    @inline(never)
    func asyncRoute(depth: Int) async -> Int {
        await Task.yield()
        return await asyncMiddleware(depth: depth) + 1
    }

    @inline(never)
    func asyncMiddleware(depth: Int) async -> Int {
        await Task.yield()
        return await asyncLevel(depth) + 1
    }

    @inline(never)
    func asyncLevel(_ remaining: Int) async -> Int {
        await Task.yield()
        if remaining > 1 { return await asyncLevel(remaining - 1) + 1 }
        return await asyncHandler() + 1
    }

    @inline(never)
    func asyncHandler() async -> Int {
        await Task.yield()
        if let next { return await next.asyncHandler() + 1 }
        asyncChainBlocker(600)
        return 1
    }
}

func runAsyncChain(target: String, depth: Int) {
    let second = ChainActor(label: "probe.async.second")
    let actor = ChainActor(label: "probe.async", next: target == "actors" ? second : nil)
    let detector = StallDetector(target: .queue(actor.executor.queue), threshold: .milliseconds(250))
    watchAsync(detector, queue: actor.executor.queue)
    Task(name: "request 42") {
        try? await Task.sleep(for: .milliseconds(300))
        _ = await actor.asyncRoute(depth: depth)
    }
    dispatchMain()
}

private func watchAsync(_ detector: StallDetector, queue: DispatchQueue) {
    detector.start()
    Task.detached {
        for await event in detector.events {
            report(event)
            let names = event.backtrace.frames.map { $0.function ?? "?" }
            emit("ASYNC \(event.phase.rawValue) - \(names.joined(separator: "|"))")
            if event.phase == .ended { finishAndExit(detector)() }
        }
    }
}
