import Dispatch
import Foundation
import StallDetection

// `async-alternate`: one task on an actor (a serial queue as its executor) that
// switches for 3 s between two chains of the same depth, altP1 → altP2 →
// altP3 and altQ1 → altQ2 → altQ3, none of which suspends, each ending in a
// spin of 1–200 µs. The task allocator puts both chains' contexts at the same
// addresses: a sample whose callers were read after the task had switched
// mixes the two. `async-alternate shared`: both chains end in the same async
// function, sharedLeaf, which spins in sharedSpinP or sharedSpinQ after the
// chain that called it (sharedP1 → sharedP2, sharedQ1 → sharedQ2): nothing in
// the stack tells the two apart (a known limit). Watched as `.queue`, threshold
// 100 ms. Extra output lines:
//   ALTSTARTED <mixed 0|1> <has callers 0|1>   the `.started` report
//   ALTPROFILE <samples in a chain> <of them mixing both> <of them with their callers>
// With ALT_DUMP=1 in the environment, the `.ended` profile's folded stacks follow.

/// Spins `microseconds`, the chains' blocking call.
@inline(never)
func alternationSpin(_ microseconds: Int) {
    let end = DispatchTime.now().uptimeNanoseconds + UInt64(microseconds) * 1_000
    while DispatchTime.now().uptimeNanoseconds < end {}
}

/// A call the Q chain makes after each await, so that no Q level has a P level's
/// body: the compiler merges functions with equal bodies, and a merged one is
/// named after one of them.
@inline(never)
func alternationMark(_ value: Int) -> Int { value &+ 1 }

@inline(never) func altP3(_ us: Int, isolation: isolated (any Actor)? = #isolation) async { alternationSpin(us) }
@inline(never) func altP2(_ us: Int, isolation: isolated (any Actor)? = #isolation) async { await altP3(us) }
@inline(never) func altP1(_ us: Int, isolation: isolated (any Actor)? = #isolation) async { await altP2(us) }
@inline(never) func altQ3(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    alternationSpin(us / 2)
    alternationSpin(us - us / 2)
    return alternationMark(us)
}
@inline(never) func altQ2(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    alternationMark(await altQ3(us))
}
@inline(never) func altQ1(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    alternationMark(await altQ2(us))
}

@inline(never) func sharedSpinP(_ us: Int) { alternationSpin(us) }
@inline(never) func sharedSpinQ(_ us: Int) {
    alternationSpin(us / 2)
    alternationSpin(us - us / 2)
}
@inline(never) func sharedLeaf(_ us: Int, _ p: Bool, isolation: isolated (any Actor)? = #isolation) async -> Int {
    if p { sharedSpinP(us) } else { sharedSpinQ(us) }
    return us
}
@inline(never) func sharedP2(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await sharedLeaf(us, true)
}
@inline(never) func sharedP1(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    await sharedP2(us)
}
@inline(never) func sharedQ2(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    alternationMark(await sharedLeaf(us, false))
}
@inline(never) func sharedQ1(_ us: Int, isolation: isolated (any Actor)? = #isolation) async -> Int {
    alternationMark(await sharedQ2(us))
}

/// Switches between the two chains until `end`.
@inline(never)
func alternateChains(until end: ContinuousClock.Instant, isolation: isolated (any Actor)? = #isolation) async {
    var random = SystemRandomNumberGenerator()
    while ContinuousClock.now < end {
        await altP1(Int.random(in: 1...200, using: &random))
        _ = await altQ1(Int.random(in: 1...200, using: &random))
    }
}

/// Switches between the two chains ending in sharedLeaf until `end`.
@inline(never)
func alternateSharedChains(until end: ContinuousClock.Instant, isolation: isolated (any Actor)? = #isolation) async {
    var random = SystemRandomNumberGenerator()
    while ContinuousClock.now < end {
        _ = await sharedP1(Int.random(in: 1...40, using: &random))
        _ = await sharedQ1(Int.random(in: 1...40, using: &random))
    }
}

/// Which chains a stack's names show: (P, Q, the switching loop above them).
/// With a shared leaf, the spin below it tells its chain as well as the callers
/// above it do.
private func chains(in names: [String]) -> (p: Bool, q: Bool, callers: Bool) {
    (
        names.contains { $0.hasPrefix("altP") || $0.hasPrefix("sharedP") || $0.hasPrefix("sharedSpinP") },
        names.contains { $0.hasPrefix("altQ") || $0.hasPrefix("sharedQ") || $0.hasPrefix("sharedSpinQ") },
        names.contains { $0.hasPrefix("alternateChains") || $0.hasPrefix("alternateSharedChains") }
    )
}

func runAsyncAlternation(sharedLeaf: Bool) {
    let actor = ChainActor(label: "probe.alternate")
    let detector = StallDetector(target: .queue(actor.executor.queue), threshold: .milliseconds(100))
    detector.start()
    Task.detached {
        for await event in detector.events {
            report(event)
            if event.phase == .started {
                let shown = chains(in: event.backtrace.frames.compactMap(\.function))
                emit("ALTSTARTED \(shown.p && shown.q ? 1 : 0) \(shown.callers ? 1 : 0)")
                continue
            }
            var (inChain, mixed, withCallers) = (0, 0, 0)
            for line in event.profile.foldedStacks().split(separator: "\n") {
                let count = line.split(separator: " ").last.flatMap { Int($0) } ?? 0
                let shown = chains(in: line.split(separator: ";").map(String.init))
                guard shown.p || shown.q else { continue }
                inChain += count
                if shown.p && shown.q { mixed += count }
                if shown.callers { withCallers += count }
            }
            emit("ALTPROFILE \(inChain) \(mixed) \(withCallers)")
            if ProcessInfo.processInfo.environment["ALT_DUMP"] != nil { emit(event.profile.foldedStacks()) }
            finishAndExit(detector)()
        }
    }
    Task {
        try? await Task.sleep(for: .milliseconds(300))
        await actor.alternate(for: .seconds(3), sharedLeaf: sharedLeaf)
    }
    dispatchMain()
}

extension ChainActor {
    @inline(never)
    func alternate(for duration: Duration, sharedLeaf: Bool) async {
        if sharedLeaf {
            await alternateSharedChains(until: ContinuousClock.now + duration)
        } else {
            await alternateChains(until: ContinuousClock.now + duration)
        }
    }
}
