import Foundation
import NIOCore
import NIOPosix

/// Arm + cancel with the peers that need more set-up: swift-nio, Foundation `Timer`,
/// `Task.sleep`.
enum PeerArmCancel {
    /// `EventLoop.scheduleTask` + `cancel()`, called on the loop's own thread (its
    /// fast path), with `pending` other tasks scheduled an hour out.
    static func nio(pending: Int, iterations: Int) -> Double {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let loop = group.next()
        return try! loop.submit {
            let keep = (0..<pending).map { _ in loop.scheduleTask(in: .hours(1)) {} }
            defer { for task in keep { task.cancel() } }
            return nanosecondsPerOperation(iterations: iterations) {
                loop.scheduleTask(in: .seconds(10)) {}.cancel()
            }
        }.wait()
    }

    /// A Foundation `Timer` added to the current run loop, then invalidated.
    static func foundationTimer(pending: Int, iterations: Int) -> Double {
        let loop = RunLoop.current
        let keep = (0..<pending).map { _ -> Timer in
            let timer = Timer(timeInterval: 3600, repeats: false) { _ in }
            loop.add(timer, forMode: .default)
            return timer
        }
        defer { for timer in keep { timer.invalidate() } }
        return nanosecondsPerOperation(iterations: iterations, rounds: 3) {
            let timer = Timer(timeInterval: 10, repeats: false) { _ in }
            loop.add(timer, forMode: .default)
            timer.invalidate()
        }
    }

    /// A task sleeping 10 s, created and cancelled.
    static func taskSleep(iterations: Int) -> Double {
        nanosecondsPerOperation(iterations: iterations) {
            let task = Task { try? await Task.sleep(for: .seconds(10)) }
            task.cancel()
        }
    }
}
