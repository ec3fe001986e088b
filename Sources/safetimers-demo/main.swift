// The guided tour: `swift run safetimers-demo` (about 18 seconds), or
// `swift run safetimers-demo --section NAME` for one part.

import Foundation

let sections: [(name: String, summary: String, run: () -> Void)] = [
    ("watchdog", "a Watchdog catching an overrunning section, silent for a fast one", watchdogSection),
    ("timer", "a RepeatingTimer through every state, and a periodic-jobs registry", timerSection),
    ("delayed", "DelayedWork cancelled: captures released before cancel() returns", delayedWorkSection),
    ("owner", "an owner-bound timer stopping when its owner goes away", ownerSection),
    ("stall", "a real main-thread stall: the blocking function, the screen, where the time went", stallSection),
    ("async", "a stall on an actor: the callers that awaited their way to it", asyncStallSection),
    ("fatal", "a stall that ends in a kill, read back by the next run", fatalSection),
]

@MainActor
func usage() -> String {
    var text = "usage: safetimers-demo [--section NAME] [--help]\n\nsections:\n"
    for section in sections {
        text += "  \(section.name.padding(toLength: 9, withPad: " ", startingAt: 0)) \(section.summary)\n"
    }
    return text
}

var arguments = Array(CommandLine.arguments.dropFirst())
// The fatal section runs this executable again as the process that hangs.
if arguments.first == "--fatal-child", arguments.count == 2 { fatalStallChild(path: arguments[1]) }
var selected = sections
while let argument = arguments.first {
    arguments.removeFirst()
    switch argument {
    case "--help", "-h":
        print(usage(), terminator: "")
        exit(0)
    case "--section":
        guard let name = arguments.first, let section = sections.first(where: { $0.name == name }) else {
            FileHandle.standardError.write(Data(("unknown or missing section name\n" + usage()).utf8))
            exit(2)
        }
        arguments.removeFirst()
        selected = [section]
    default:
        FileHandle.standardError.write(Data(("unknown argument '\(argument)'\n" + usage()).utf8))
        exit(2)
    }
}

say("SafeTimers guided tour: \(selected.map(\.name).joined(separator: ", "))")
for section in selected { section.run() }
say()
say("Done. Read on in README.md: every primitive takes a `scheduler:`; tests pass a ManualTimerScheduler.")
