import StallDetection

/// `StallDetector.withActivity` (a label a stall report shows) against a
/// task-local value bound for the same scope, the standard library's way to
/// label work; both on one thread, around a call that does nothing.
enum Activities {
    @TaskLocal static var label = ""

    /// One activity with a literal label: the cost of wrapping every request or
    /// screen update.
    static func withActivity(iterations: Int) -> Double {
        nanosecondsPerOperation(iterations: iterations) {
            StallDetector.withActivity("screen: Feed") { blackHole(0) }
        }
    }

    /// Two nested activities, the inner label changing every call (a new label
    /// at a depth takes the record's lock once).
    static func nestedChanging(iterations: Int) -> Double {
        let labels = (0..<16).map { "request \($0) " + String(repeating: "x", count: 16) }
        var index = 0
        return nanosecondsPerOperation(iterations: iterations) {
            index = (index + 1) & 15
            StallDetector.withActivity("screen: Feed") {
                StallDetector.withActivity(labels[index]) { blackHole(0) }
            }
        }
    }

    static func taskLocal(iterations: Int) -> Double {
        nanosecondsPerOperation(iterations: iterations) {
            Activities.$label.withValue("screen: Feed") { blackHole(0) }
        }
    }

    static func taskLocalNested(iterations: Int) -> Double {
        let labels = (0..<16).map { "request \($0) " + String(repeating: "x", count: 16) }
        var index = 0
        return nanosecondsPerOperation(iterations: iterations) {
            index = (index + 1) & 15
            Activities.$label.withValue("screen: Feed") {
                Activities.$label.withValue(labels[index]) { blackHole(0) }
            }
        }
    }
}
