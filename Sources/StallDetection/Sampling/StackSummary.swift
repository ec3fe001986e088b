/// A sampled stack judged by its functions' kinds (innermost first), as
/// ``StackShape`` judges named frames.
struct StackSummary: Sendable {
    /// A thread running a job for a queue or run loop (never the manager).
    let runsJob: Bool
    /// A thread waiting for work and running none.
    let looksIdle: Bool
    /// A thread running a Swift concurrency job.
    let runsSwiftJob: Bool
    /// The certain frames reach the thread's root.
    let reachesRoot: Bool

    /// A cooperative-pool thread busy with the pool's work: a Swift job, or
    /// (where they share threads) a global-queue block, as
    /// ``StackShape/holdsPoolThread(_:)`` judges named frames.
    var holdsPoolThread: Bool { runsSwiftJob || (StackShape.poolSharesGlobalQueue && runsJob) }
    /// How many job blocks libdispatch is calling on the thread (``FrameKind/callout``).
    let callouts: Int

    /// Judges the frames a report would keep (``StackShape/prune(_:)``): the
    /// certain ones, and the scan's frames only beyond the last certain one when
    /// the chain does not reach the thread's root (the scan finds stale return
    /// addresses too: an idle worker's stack still holds those of the job it
    /// ran before).
    init(kinds: [FrameKind], certain: [Bool]) {
        let rootReached = zip(kinds, certain).contains { $0.contains(.root) && $1 }
        let lastCertain = certain.lastIndex(of: true) ?? -1
        var kept: [FrameKind] = []
        var callouts = 0
        for (index, (kind, isCertain)) in zip(kinds, certain).enumerated() {
            let scannedBeyond =
                !rootReached && index > lastCertain && index - lastCertain <= StackUnwinder.uncertainLimit
            guard isCertain || scannedBeyond else { continue }
            kept.append(kind)
            if isCertain && kind.contains(.callout) { callouts += 1 }
        }
        var all: FrameKind = []
        for kind in kept { all.formUnion(kind) }
        let kinds = kept
        let waitsForEvents = kinds.lazy.filter { $0.contains(.named) }.prefix(4).contains { $0.contains(.eventWait) }
        runsJob = all.contains(.job) && !all.contains(.manager)
        looksIdle = !all.contains(.job) && (all.contains(.idle) || waitsForEvents)
        runsSwiftJob = all.contains(.swiftJob)
        reachesRoot = rootReached
        self.callouts = callouts
    }
}
