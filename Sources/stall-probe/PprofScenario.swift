import Dispatch
import Foundation
import StallDetection

// `stall-probe pprof <path>`: a stall's profile exported as pprof, for
// `.ci/pprof-check`, which reads the file with `go tool pprof`. Extra output lines
// (tab-separated, for the script to compare with what pprof shows):
//   PPROF-FILE <path>                 the file written, after the second stall
//   PPROF-TOTAL <sampleCount>
//   PPROF-FUNCTION <samples> <name>   each function of the profile, most samples first
//   PPROF-STACK <samples> <names>     each distinct stack, root first, joined by ";"

/// `pprof`: a first stall of 400 ms names the code, then a 900 ms stall in
/// profileStepA and profileStepB inside an activity, whose `.ended` event is
/// written to the path as pprof; the helper then exits.
func runPprofScenario() -> Never {
    guard let path = CommandLine.arguments.dropFirst(2).first else {
        print("usage: stall-probe pprof <path>")
        exit(2)
    }
    let queue = DispatchQueue(label: "probe.pprof")
    let detector = StallDetector(target: .queue(queue), threshold: .milliseconds(250))
    detector.start()
    Task.detached {
        var ended = 0
        for await event in detector.events where event.phase == .ended {
            ended += 1
            guard ended == 2 else { continue }
            writePprof(event, to: path)
            finishAndExit(detector)()
        }
    }
    queue.asyncAfter(deadline: .now() + 0.3) { profileStepB(400) }
    queue.asyncAfter(deadline: .now() + 1.2) {
        StallDetector.withActivity("screen: Profile") {
            profileStepA(600)
            profileStepB(300)
        }
    }
    dispatchMain()
}

private func writePprof(_ event: StallEvent, to path: String) {
    guard FileManager.default.createFile(atPath: path, contents: Data(event.pprof())) else {
        print("could not write \(path)")
        exit(1)
    }
    let profile = event.profile
    emit("PPROF-FILE\t\(path)")
    emit("PPROF-TOTAL\t\(profile.sampleCount)")
    for function in profile.functions { emit("PPROF-FUNCTION\t\(function.samples)\t\(function.name)") }
    for stack in profile.stacks {
        emit("PPROF-STACK\t\(stack.samples)\t" + profile.functions(of: stack).map(\.name).joined(separator: ";"))
    }
}
