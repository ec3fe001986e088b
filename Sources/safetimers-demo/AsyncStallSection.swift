import Dispatch
import Foundation
import StallDetection

// MARK: - A stall in async code

/// An actor's executor: a serial dispatch queue, as a server's actors often have.
final class PhotoQueueExecutor: SerialExecutor {
    let queue = DispatchQueue(label: "photo-library")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

actor PhotoLibrary {
    let executor = PhotoQueueExecutor()

    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    @inline(never)
    func importAlbum() async {
        await Task.yield()
        await importPhoto()
    }

    @inline(never)
    func importPhoto() async {
        await Task.yield()
        await makePreview()
    }

    @inline(never)
    func makePreview() async {
        await Task.yield()
        resizeSynchronously()
    }
}

/// The mistake: 0.6 s of synchronous work on the actor's executor.
@inline(never)
func resizeSynchronously() {
    usleep(600_000)
    blackHole(2)
}

func asyncStallSection() {
    header(
        "StallDetector in async code",
        problem: "in async code a stack ends at the first await: the report names the function that blocked, "
            + "not the code that awaited its way there.")
    let library = PhotoLibrary()
    let detector = StallDetector(target: .queue(library.executor.queue), threshold: .milliseconds(250))
    detector.start()
    let started = Shared<StallEvent?>(nil)
    let ended = Shared<Bool>(false)
    Task.detached {
        for await event in detector.events {
            if event.phase == .started {
                started.update { $0 = event }
                sayReport(event, frames: 9)
            } else {
                ended.update { $0 = true }
            }
        }
    }
    say("  the actor PhotoLibrary runs on a serial queue; importAlbum() awaits importPhoto(), which awaits")
    say("  makePreview(), which resizes a photo synchronously for 0.6 s on the actor…")
    Task { await library.importAlbum() }
    let end = Date().addingTimeInterval(4)
    while !ended.get() && Date() < end { usleep(50_000) }
    detector.stop()
    let awaiting = started.get()?.backtrace.frames.filter(\.isAwaiting).compactMap(\.function) ?? []
    say("SafeTimers: the report goes on past the first await, to the callers that awaited: \(awaiting.prefix(3))")
    say("  the actor's queue's probes, as an operator's graph sees them (detector.lagSnapshot()):")
    say("  \(detector.lagSnapshot())")
}
