import Testing

@testable import SafeTimers

@Suite("Deadline arithmetic")
struct DeadlineArithmeticTests {
    @Test("durations convert to nanoseconds, saturating instead of trapping")
    func conversions() {
        #expect(DeadlineArithmetic.nanoseconds(.milliseconds(1500)) == 1_500_000_000)
        #expect(DeadlineArithmetic.nanoseconds(.nanoseconds(-5)) == -5)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(Int64.max)) == Int64.max)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(Int64.min)) == Int64.min)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(Int64(9_223_372_036))) == 9_223_372_036_000_000_000)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(Int64(9_223_372_037))) == Int64.max)
    }

    @Test("the 64-bit fast path agrees with the 128-bit conversion around every boundary it has")
    func fastPathAgrees() {
        func reference(_ duration: Duration) -> Int64 {
            let (seconds, attoseconds) = duration.components
            return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        }
        var samples: [Duration] = [
            .zero, .nanoseconds(1), .nanoseconds(-1), .seconds(10), .seconds(18), .seconds(19),
            Duration(secondsComponent: 0, attosecondsComponent: 1),
            Duration(secondsComponent: 0, attosecondsComponent: 999_999_999),
            Duration(secondsComponent: -1, attosecondsComponent: 999_999_999_999_999_999),
            Duration(secondsComponent: 18, attosecondsComponent: 446_744_073_709_551_615),  // 2^64 - 1 as
            Duration(secondsComponent: 18, attosecondsComponent: 446_744_073_709_551_616),  // 2^64 as
        ]
        var generator = SplitMix64(seed: 3)
        for _ in 0..<10_000 {
            let seconds = Int64(bitPattern: generator.next()) % 40
            let attoseconds = Int64(generator.next() % 1_000_000_000_000_000_000)
            samples.append(Duration(secondsComponent: seconds, attosecondsComponent: attoseconds))
        }
        for duration in samples {
            #expect(DeadlineArithmetic.nanoseconds(duration) == reference(duration), "\(duration)")
        }
    }

    @Test("negative and zero delays mean now; overflowing ones mean never")
    func deadlines() {
        #expect(DeadlineArithmetic.deadline(now: 100, after: .zero) == 100)
        #expect(DeadlineArithmetic.deadline(now: 100, after: .seconds(-3)) == 100)
        #expect(DeadlineArithmetic.deadline(now: 100, after: .seconds(Int64.max)) == DeadlineArithmetic.never)
        #expect(DeadlineArithmetic.deadline(now: Int64.max - 10, after: .nanoseconds(11)) == DeadlineArithmetic.never)
        #expect(DeadlineArithmetic.deadline(now: 5, after: .nanoseconds(7)) == 12)
    }
}
