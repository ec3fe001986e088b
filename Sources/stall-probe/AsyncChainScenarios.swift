import Dispatch
import Foundation
import StallDetection
import Synchronization

// Stalls inside async code: `async-chain <target> [depth]` blocks 600 ms at the
// end of a chain of awaits, asyncRoute → asyncMiddleware → `depth` asyncLevels
// (default 1) → asyncHandler → asyncChainBlocker, where every level first awaits `Task.yield()` (so each
// runs as a resumed partial function) and then awaits the next. Targets:
//   queue    an actor whose executor is a serial dispatch queue, watched as `.queue`
//   custom   the same actor, watched as `.custom` through its queue
//   pool     a task on the cooperative pool, every pool thread blocked, `.cooperativePool`
//   main     the main actor under an async entry point, `.mainQueue`
//   group    a task group's child task on the actor
//   asynclet an `async let` child task on the actor
//   actors   the actor awaits a second actor (on its own queue) that blocks
//   deep     as queue, with `depth` levels (200 in the tests)
//   samehop  as actors, but the second actor's executor runs each job at once, on the
//            thread that enqueues it: the hop runs the task's next job inside its own
//            job (below it, the runtime's `swift_task_switch`), on the first actor's queue
//   nested   as queue, but the actor's handler starts the chain as a new task ("inner")
//            on an executor that runs its jobs at once (`InlineTaskExecutor`): the
//            inner task's job runs inside the outer task's (nestedOuterRoute →
//            nestedOuterHandler), on the actor's queue
//   deepstack as queue, but the handler (deepStackRoute → deepStackHandler) blocks under a
//            synchronous recursion 300 deep with 1 KB a level: a stack deeper than the
//            sampler copies, whose async frames lie beyond the copy
//   sync     a task on the cooperative pool calls `queue.sync` into the watched queue
//            (no actor) and blocks in it: the blocked thread is a pool thread that
//            never answered a probe, asleep, and its task is "sync caller"
// Extra output lines, per event:
//   ASYNC <phase> - <the report's frames, one name each, `|`-separated>
//   ASYNCTASK <phase> <the blocked thread's task, then its parents: each quoted name or
//             `unnamed`, then its relation, ` ← `-separated; `-` for none>
//   ASYNCPOOL <phase> <index> <frames>   each pool thread's stack (pool)
//   ASYNCPROFILE <phase> <samples> <samples in asyncChainBlocker> <of them, without asyncRoute>
//                <of those, with a marker saying why the awaiting callers stop>
//   ASYNCUNROUTED <folded stack> <count>  each stack in the blocker without asyncRoute

/// Where an async chain's blocker runs: a serial dispatch queue as an actor's
/// executor, or (`runsJobsAtOnce`) the thread that enqueues the job.
final class QueueExecutor: SerialExecutor {
    let queue: DispatchQueue
    let runsJobsAtOnce: Bool

    init(label: String, runsJobsAtOnce: Bool = false) {
        queue = DispatchQueue(label: label)
        self.runsJobsAtOnce = runsJobsAtOnce
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        if runsJobsAtOnce {
            job.runSynchronously(on: executor)
        } else {
            queue.async { job.runSynchronously(on: executor) }
        }
    }
}

/// Runs every job at once, on the thread that enqueues it: a task preferring
/// it starts inside the code that makes it.
final class InlineTaskExecutor: TaskExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        UnownedJob(job).runSynchronously(on: asUnownedTaskExecutor())
    }
}

/// The outer task of `nested`: awaits its handler, which runs the chain as
/// another task inside its own job.
@inline(never)
func nestedOuterRoute(depth: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    return await nestedOuterHandler(depth: depth) + 1
}

@inline(never)
func nestedOuterHandler(depth: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    let inner = Task(name: "inner", executorPreference: InlineTaskExecutor()) {
        await asyncRoute(depth: depth, hop: nil, isolation: nil)
    }
    _ = inner
    return 1
}

/// The blocking call at the end of every chain.
@inline(never)
func asyncChainBlocker(_ milliseconds: Int) {
    let end = ContinuousClock.now + .milliseconds(milliseconds)
    while ContinuousClock.now < end { usleep(5_000) }
}

/// The chain's levels run on their caller's actor (none: the global executor).
@inline(never)
func asyncRoute(depth: Int, hop: ChainActor?, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    return await asyncMiddleware(depth: depth, hop: hop) + 1
}

@inline(never)
func asyncMiddleware(depth: Int, hop: ChainActor?, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    return await asyncLevel(depth, hop: hop) + 1
}

@inline(never)
func asyncLevel(_ remaining: Int, hop: ChainActor?, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    if remaining > 1 { return await asyncLevel(remaining - 1, hop: hop) + 1 }
    return await asyncHandler(hop: hop) + 1
}

@inline(never)
func asyncHandler(hop: ChainActor?, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    if let hop { return await (hop.executor.runsJobsAtOnce ? hop.blockingAtOnce() : hop.blockingHandler()) + 1 }
    asyncChainBlocker(600)
    return 1
}

@inline(never)
func deepStackRoute(isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    return await deepStackHandler() + 1
}

@inline(never)
func deepStackHandler(isolation: isolated (any Actor)? = #isolation) async -> Int {
    await Task.yield()
    return deepStackParse(300)
}

/// A synchronous recursion with 1 KB of stack a level, blocking at its bottom.
@inline(never)
func deepStackParse(_ level: Int) -> Int {
    withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1_024) { scratch in
        scratch.initialize(repeating: UInt8(truncatingIfNeeded: level))
        if level == 0 {
            asyncChainBlocker(600)
            return Int(scratch[0])
        }
        return deepStackParse(level - 1) &+ Int(scratch[1_023])
    }
}

/// An actor whose executor is a serial dispatch queue.
actor ChainActor {
    let executor: QueueExecutor

    init(label: String, runsJobsAtOnce: Bool = false) {
        executor = QueueExecutor(label: label, runsJobsAtOnce: runsJobsAtOnce)
    }

    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    @inline(never)
    func run(depth: Int, hop: ChainActor? = nil) async -> Int {
        await asyncRoute(depth: depth, hop: hop)
    }

    @inline(never)
    func runNested(depth: Int) async -> Int {
        await nestedOuterRoute(depth: depth)
    }

    @inline(never)
    func runDeepStack() async -> Int {
        await deepStackRoute()
    }

    /// The blocker, with no `Task.yield()` first: on an executor that runs jobs
    /// at once, a yield would run the task again inside its own job. (Not the
    /// same code as blockingHandler's after its yield: a release build would
    /// make one a jump into the other, named after the other.)
    @inline(never)
    func blockingAtOnce() async -> Int {
        asyncChainBlocker(601)
        return 2
    }

    @inline(never)
    func blockingHandler() async -> Int {
        await Task.yield()
        asyncChainBlocker(600)
        return 1
    }
}

func runAsyncChain(target: String, depth: Int) {
    let first = ChainActor(label: "probe.async")
    let second = ChainActor(label: "probe.async.second", runsJobsAtOnce: target == "samehop")
    let watched = target == "actors" ? second.executor.queue : first.executor.queue
    let detector: StallDetector
    switch target {
    case "custom":
        detector = StallDetector(
            target: .custom(name: "async custom") { probe in watched.async(execute: probe) },
            threshold: .milliseconds(250))
    case "pool": detector = StallDetector(target: .cooperativePool, threshold: .milliseconds(250))
    case "main": detector = StallDetector(target: .mainQueue, threshold: .milliseconds(250))
    default: detector = StallDetector(target: .queue(watched), threshold: .milliseconds(250))
    }
    watchAsync(detector, priority: target == "pool" ? .high : nil)
    startAsyncChain(target: target, depth: depth, first: first, second: second)
    dispatchMain()
}

private func startAsyncChain(target: String, depth: Int, first: ChainActor, second: ChainActor) {
    switch target {
    case "pool":
        let width = ProcessInfo.processInfo.activeProcessorCount
        emit("WIDTH \(width)")
        for index in 0..<width {
            Task.detached(name: "pool request \(index)", priority: .medium) {
                try? await Task.sleep(for: .milliseconds(300))
                _ = await asyncRoute(depth: depth, hop: nil)
            }
        }
    case "main":
        Task(name: "request 42") { @MainActor in
            try? await Task.sleep(for: .milliseconds(300))
            _ = await asyncRoute(depth: depth, hop: nil)
        }
    case "group":
        Task(name: "request 42") {
            try? await Task.sleep(for: .milliseconds(300))
            await withTaskGroup(of: Int.self) { group in
                group.addTask { await first.run(depth: depth) }
                await group.waitForAll()
            }
        }
    case "asynclet":
        Task(name: "request 42") {
            try? await Task.sleep(for: .milliseconds(300))
            async let result = first.run(depth: depth)
            _ = await result
        }
    case "nested":
        Task(name: "request 42") {
            try? await Task.sleep(for: .milliseconds(300))
            _ = await first.runNested(depth: depth)
        }
    case "deepstack":
        Task(name: "request 42") {
            try? await Task.sleep(for: .milliseconds(300))
            _ = await first.runDeepStack()
        }
    case "sync":
        Task.detached(name: "sync caller", priority: .medium) {
            try? await Task.sleep(for: .milliseconds(300))
            first.executor.queue.sync { asyncChainBlocker(600) }
        }
    default:
        Task(name: "request 42") {
            try? await Task.sleep(for: .milliseconds(300))
            _ = await first.run(depth: depth, hop: ["actors", "samehop"].contains(target) ? second : nil)
        }
    }
}

private func watchAsync(_ detector: StallDetector, priority: TaskPriority?) {
    detector.start()
    Task.detached(priority: priority) {
        for await event in detector.events {
            report(event)
            emit("ASYNC \(event.phase.rawValue) - \(names(event.backtrace))")
            emit("ASYNCTASK \(event.phase.rawValue) \(tasks(event.backtrace))")
            for (index, pool) in event.poolBacktraces.enumerated() {
                emit("ASYNCPOOL \(event.phase.rawValue) \(index) \(names(pool))")
            }
            // Samples in the blocker, and those of them whose stack lacks the route
            // (a sample after the blocker returned, while the awaits return, has
            // neither: the chain is shorter then, rightly).
            var (blocked, unrouted, said) = (0, 0, 0)
            for line in event.profile.foldedStacks().split(separator: "\n") where line.contains("asyncChainBlocker") {
                let count = line.split(separator: " ").last.flatMap { Int($0) } ?? 0
                blocked += count
                if !line.contains("asyncRoute") {
                    unrouted += count
                    if line.contains("<awaiting callers not all shown") { said += count }
                    emit("ASYNCUNROUTED \(line)")
                }
            }
            emit("ASYNCPROFILE \(event.phase.rawValue) \(event.profile.sampleCount) \(blocked) \(unrouted) \(said)")
            if event.phase == .ended { finishAndExit(detector)() }
        }
    }
}

/// The blocked thread's task and its parents, innermost first, each as its
/// quoted name (or `unnamed`) and its relation, ` ← `-separated; `-` for none.
private func tasks(_ backtrace: StallBacktrace) -> String {
    guard let task = backtrace.task else { return "-" }
    return ([task] + backtrace.parentTasks).map { task in
        (task.name.map { "\"\($0)\"" } ?? "unnamed") + " " + task.relation.rawValue
    }.joined(separator: " ← ")
}

/// The frames' names, `|`-separated, an awaiting caller's ending in ` [await]`.
private func names(_ backtrace: StallBacktrace) -> String {
    backtrace.frames.map { ($0.function ?? "?") + ($0.isAwaiting ? " [await]" : "") }.joined(separator: "|")
}

// `async-many <count>`: `count` actors, each on its own serial queue watched by a
// detector of its own, all stalled at once inside the chain of awaits (depth 2),
// each by a task named "request <i>". Prints, per detector and phase:
//   ASYNCMANY <i> <phase> <its task's name or -> <1 when the frames from the
//             blocker up are asyncChainBlocker, asyncHandler, then asyncLevel,
//             asyncLevel, asyncMiddleware and asyncRoute awaiting, else 0>
/// The `async-many` events still to come.
let asyncManyEvents = Mutex(0)

func runAsyncMany(count: Int) {
    let actors = (0..<count).map { ChainActor(label: "probe.async.many.\($0)") }
    asyncManyEvents.withLock { $0 = 2 * count }
    for (index, actor) in actors.enumerated() {
        let detector = StallDetector(target: .queue(actor.executor.queue), threshold: .milliseconds(250))
        detector.start()
        Task.detached {
            for await event in detector.events {
                let frames = event.backtrace.frames.map { ($0.function ?? "?") + ($0.isAwaiting ? " [await]" : "") }
                let stack = event.backtrace.unavailableReason == nil ? "stack" : "nostack"
                let task = event.backtrace.task?.name ?? "-"
                emit("ASYNCMANY \(index) \(event.phase.rawValue) \(stack) \(chainShown(frames) ? 1 : 0) \(task)")
                if event.phase == .ended {
                    detector.stop()
                    if asyncManyEvents.withLock({
                        $0 -= 2; return $0
                    }) == 0 {
                        exit(0)
                    }
                }
            }
        }
        Task(name: "request \(index)") {
            try? await Task.sleep(for: .milliseconds(300))
            _ = await actor.run(depth: 2)
        }
    }
    dispatchMain()
}

/// Whether `frames` show the chain of `async-chain` at depth 2 from the blocker up.
private func chainShown(_ frames: [String]) -> Bool {
    guard let start = frames.firstIndex(where: { $0.hasPrefix("asyncChainBlocker(") }) else { return false }
    let expected = [
        ("asyncChainBlocker(", false), ("asyncHandler(", false), ("asyncLevel(", true), ("asyncLevel(", true),
        ("asyncMiddleware(", true), ("asyncRoute(", true),
    ]
    let shown = frames.dropFirst(start)
    return shown.count >= expected.count
        && zip(shown, expected).allSatisfy { $0.hasPrefix($1.0) && $0.hasSuffix(" [await]") == $1.1 }
}
