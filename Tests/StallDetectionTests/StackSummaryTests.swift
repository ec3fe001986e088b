import Testing

@testable import StallDetection

@Suite("StackSummary: a sample judged by its functions' names")
struct StackSummaryTests {
    static func kinds(_ names: [String]) -> [FrameKind] { names.map { FrameKind(name: $0) } }

    @Test("stale return addresses a scan finds beyond a complete chain say nothing: an idle worker runs no job")
    func staleFramesBeyondTheRoot() {
        let names = [
            "epoll_wait", "_dispatch_event_loop_drain", "_dispatch_mgr_thread", "_dispatch_worker_thread",
            "start_thread", "swift_job_run", "_dispatch_call_block_and_release",
        ]
        let certain = [true, true, true, true, true, false, false]
        let summary = StackSummary(kinds: Self.kinds(names), certain: certain)
        #expect(summary.reachesRoot)
        #expect(!summary.runsSwiftJob, "the scan's stale swift_job_run counted")
        #expect(!summary.runsJob)
        #expect(summary.looksIdle)
    }

    @Test("a chain that breaks off keeps the scan's frames just beyond it, as a report does")
    func scannedFramesBeyondABrokenChain() {
        let names = ["usleep", "uniquelyNamedPoolBlocker", "swift_job_run", "_dispatch_worker_thread"]
        let summary = StackSummary(kinds: Self.kinds(names), certain: [true, true, false, false])
        #expect(!summary.reachesRoot)
        #expect(summary.runsSwiftJob)
        #expect(summary.runsJob)
    }

    @Test("libdispatch's manager thread never runs a job, and two callouts mean a job waits in a sync")
    func managerAndCallouts() {
        let manager = StackSummary(
            kinds: Self.kinds(["_dispatch_lane_serial_drain", "_dispatch_mgr_invoke", "start_thread"]),
            certain: [true, true, true])
        #expect(!manager.runsJob)
        let nested = StackSummary(
            kinds: Self.kinds([
                "work", "_dispatch_client_callout", "_dispatch_sync_invoke_and_complete",
                "_dispatch_client_callout", "_dispatch_lane_serial_drain", "start_thread",
            ]),
            certain: Array(repeating: true, count: 6))
        #expect(nested.runsJob)
        #expect(nested.callouts == 2)
    }
}
