import Testing

@testable import StallDetection

@Suite("Frame names as a person reads them")
struct FrameNameTests {
    @Test("a closure in top-level code is named after its file; every other name is kept as demangled")
    func topLevelClosure() {
        #expect(
            Symbolicator.readableName("closure #8 in ", file: "/app/Sources/Server/main.swift")
                == "closure #8 in top-level code (main.swift)")
        #expect(
            Symbolicator.readableName("closure #2 in closure #8 in ", file: nil)
                == "closure #2 in closure #8 in top-level code")
        #expect(Symbolicator.readableName("closure #1 in run()", file: "/a/b.swift") == "closure #1 in run()")
        #expect(Symbolicator.readableName("Loop.handler(_:)", file: nil) == "Loop.handler(_:)")
    }
}
