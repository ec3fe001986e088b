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
        #expect(DeadlineArithmetic.nanoseconds(.seconds(9_223_372_036)) == 9_223_372_036_000_000_000)
        #expect(DeadlineArithmetic.nanoseconds(.seconds(9_223_372_037)) == Int64.max)
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
