import CStallCapture
import Dispatch

/// Reading a sampled stack: is the thread running a job, or waiting for one?
enum StackShape {
    /// Frames that mean the thread runs somebody's code for a queue or run loop.
    static let busyMarkers = [
        "_dispatch_client_callout", "_dispatch_call_block_and_release", "_dispatch_continuation_pop",
        "_dispatch_lane_serial_drain", "_dispatch_main_queue_callback_4CF", "__CFRUNLOOP_IS_", "swift_job_run",
        "_dispatch_sync", "_dispatch_barrier_sync", "_dispatch_lane_barrier_sync", "DispatchQueue.sync",
        "DispatchQueue._syncHelper", "DispatchQueue.asyncAndWait",
    ]

    /// True when the stack shows the thread running a Swift concurrency job.
    static func runsSwiftJob(_ frames: [StackFrame]) -> Bool {
        frames.contains { $0.function?.contains("swift_job_run") == true }
    }

    /// Whether Swift's global executor runs its jobs on libdispatch's global
    /// queues, so that a block sent with `DispatchQueue.global().async` holds a
    /// thread of the cooperative pool as a task does (Linux; on Apple platforms
    /// the pool has threads of its own). Such a block that blocks is then a
    /// culprit of a pool stall.
    static var poolSharesGlobalQueue: Bool {
        #if os(Linux)
        true
        #else
        false
        #endif
    }

    /// Whether a thread of the cooperative pool is busy with the pool's work: a
    /// Swift job, or (where they share threads) a global-queue block.
    static func holdsPoolThread(_ frames: [StackFrame]) -> Bool {
        runsSwiftJob(frames) || (poolSharesGlobalQueue && runsJob(frames))
    }

    /// Frames of libdispatch's manager thread, which drains internal queues
    /// (timers, event sources) with the same functions as a queue's worker but
    /// never runs a job of the program.
    static let managerMarkers = ["_dispatch_mgr_thread", "_dispatch_mgr_invoke"]

    /// True when the stack shows the thread running a job for a queue or run loop.
    static func runsJob(_ frames: [StackFrame]) -> Bool {
        var job = false
        for frame in frames {
            guard let name = frame.function else { continue }
            if managerMarkers.contains(where: { name.containsText($0) }) { return false }
            if !job && busyMarkers.contains(where: { name.containsText($0) }) { job = true }
        }
        return job
    }
    /// Frames that mean the thread waits for work.
    static let idleMarkers = [
        "_dispatch_worker_thread", "_dispatch_sig_thread", "_dispatch_event_loop_drain", "_dispatch_mgr_thread",
        "__CFRunLoopRun", "__CFRunLoopServiceFileDescriptors",
    ]

    /// Frames that end a complete call chain.
    static let threadRoots = ["start_thread", "clone", "__libc_start", "_start"]

    /// Whether the certain frames reach a thread's root.
    static func reachesRoot(_ frames: [StackFrame]) -> Bool {
        frames.contains { frame in
            guard !frame.isUncertain, let name = frame.function else { return false }
            return threadRoots.contains { name.hasPrefix($0) || name.containsText("_" + $0) }
        }
    }

    /// Keeps the scan's frames only where they can help: when the certain chain
    /// reaches a thread's root, every uncertain frame goes; otherwise only those
    /// beyond the last certain frame stay (the unwinder adds at most
    /// ``StackUnwinder/uncertainLimit``).
    static func prune(_ frames: [StackFrame]) -> [StackFrame] {
        if reachesRoot(frames) { return frames.filter { !$0.isUncertain } }
        guard let lastCertain = frames.lastIndex(where: { !$0.isUncertain }) else {
            return Array(frames.prefix(StackUnwinder.uncertainLimit))
        }
        return Array(
            frames[...lastCertain].filter { !$0.isUncertain }
                + frames[(lastCertain + 1)...].prefix(StackUnwinder.uncertainLimit))
    }

    /// True when the stack shows a thread waiting for work and running none: a
    /// parked dispatch worker, a run loop asleep, or an event loop (SwiftNIO's,
    /// say) parked in `epoll_wait` (`kevent` on Apple platforms).
    static func looksIdle(_ frames: [StackFrame]) -> Bool {
        let names = frames.compactMap(\.function)
        if names.contains(where: { name in busyMarkers.contains { name.containsText($0) } }) { return false }
        return names.contains(where: { name in idleMarkers.contains { name.containsText($0) } })
            || waitsForEvents(frames)
    }

    /// The calls a thread sleeps in until another thread wakes it: a condition
    /// variable, a semaphore, a contended lock, a bare futex.
    static let wakeWaitCalls = [
        "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "futex_wait",
        "futex_abstimed_wait", "__lll_lock_wait", "sem_wait", "sem_timedwait", "sem_clockwait",
    ]

    /// True when the innermost named frames (up to 4) sleep until another
    /// thread wakes them (``wakeWaitCalls``): an executor of its own parked on
    /// a condition, or a job waiting for a lock.
    static func waitsToBeWoken(_ frames: [StackFrame]) -> Bool {
        innermostCalls(frames, include: wakeWaitCalls)
    }

    /// The system calls an event loop parks in.
    static let eventWaitCalls = ["epoll_wait", "epoll_pwait", "kevent"]

    /// True when the innermost named frames (the C library's, up to 4) are an
    /// event-wait system call: the thread sleeps until a descriptor is ready.
    static func waitsForEvents(_ frames: [StackFrame]) -> Bool {
        innermostCalls(frames, include: eventWaitCalls)
    }

    /// Whether the innermost named frames (the C library's, up to 4) include one
    /// of `calls`.
    private static func innermostCalls(_ frames: [StackFrame], include calls: [String]) -> Bool {
        frames.lazy.compactMap(\.function).prefix(4).contains { name in calls.contains { name.contains($0) } }
    }
}
