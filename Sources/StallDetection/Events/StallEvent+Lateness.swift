import SafeTimers

extension StallEvent {
    /// Why a stall was reported later than promised: `.started` comes within the
    /// threshold plus one heartbeat of the stall's start unless the detector
    /// itself could not run, or sampling and naming the stack took long (the
    /// first stall of a debug build). What held it up is
    /// measured, so that a late report says so instead of looking like a
    /// shorter stall.
    ///
    /// The detector's looks and samples run on its own threads. On a machine
    /// whose cores are all taken (more runnable threads than cores, a process at
    /// a low priority beside busy ones) those threads wait for a core like any
    /// other, and the look that finds the stall runs late; when the target
    /// answers before that look, the stall is reported with its end
    /// (``reportedAfterEnd``).
    public struct Lateness: Sendable, Hashable, CustomStringConvertible {
        /// How much later than the threshold plus one heartbeat after the
        /// stall's start the event was made (``sampling`` included).
        public let delay: Duration
        /// How long after it was due the detector's look that found the stall
        /// ran: the time its threads waited to run (no free core, or the
        /// detector's thread busy with its previous sample).
        public let lookWaited: Duration
        /// How long sampling and naming the blocked thread's stack took.
        public let sampling: Duration
        /// True when the first look's sample showed no job running, and a
        /// second look, a heartbeat later, confirmed the stall.
        public let confirmedBySecondLook: Bool
        /// True when the target answered before the stall could be reported:
        /// its `.started` event comes with its `.ended`.
        public let reportedAfterEnd: Bool

        /// How late a report is, or nil when it is on time (less than a
        /// millisecond late): found after `stallDuration` of a stall (its whole
        /// length when the report came with its end) under `threshold` and
        /// `heartbeat`, and made `sampling` later.
        init?(
            stallDuration: Duration, threshold: Duration, heartbeat: Duration, sampling: Duration,
            lookWaited: Duration, confirmedBySecondLook: Bool, reportedAfterEnd: Bool
        ) {
            let delay = stallDuration + sampling - threshold - heartbeat
            guard delay >= .milliseconds(1) else { return nil }
            self.delay = delay
            self.lookWaited = max(.zero, lookWaited)
            self.sampling = sampling
            self.confirmedBySecondLook = confirmedBySecondLook
            self.reportedAfterEnd = reportedAfterEnd
        }

        /// One line: how late, and each cause that was measured.
        public var description: String {
            var causes: [String] = []
            if lookWaited >= .milliseconds(1) {
                causes.append(
                    "the detector's look ran \(milliseconds(lookWaited)) after it was due (its threads waited to run)")
            }
            if confirmedBySecondLook { causes.append("a second look confirmed the stall") }
            if sampling >= .milliseconds(1) { causes.append("sampling took \(milliseconds(sampling))") }
            if reportedAfterEnd { causes.append("the target answered before the stall could be reported") }
            let head = "reported \(milliseconds(delay)) late"
            return causes.isEmpty ? head : head + ": " + causes.joined(separator: "; ")
        }

        private func milliseconds(_ duration: Duration) -> String {
            "\(DeadlineArithmetic.nanoseconds(duration) / 1_000_000) ms"
        }
    }
}
