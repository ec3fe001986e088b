/// The real-time scheduler: one tickless thread and a timing wheel of deadlines.
///
/// ``shared`` is the default `scheduler:` of every primitive. Its thread starts
/// at the first arming and then:
/// - sleeps until the earliest deadline, and is woken early only when an entry
///   earlier than that is armed: with nothing due it makes no wake-ups at all;
/// - never runs your handlers itself: each primitive delivers its handler to the
///   `DispatchQueue` you gave it, so a slow handler cannot delay other timers.
///
/// Arming, re-arming and cancelling are O(1) in the number of armed timers (a
/// hierarchical timing wheel) with no search: cancelling removes the entry and
/// releases what it holds at once.
///
/// ## The clock
/// Deadlines use the monotonic clock (`CLOCK_MONOTONIC` on Linux,
/// `CLOCK_UPTIME_RAW` on Apple platforms). It does not jump when the wall clock
/// changes and it does not advance while the machine sleeps or the process is
/// stopped: a 2-second watchdog armed just before the machine sleeps fires after
/// 2 seconds of awake time, never spuriously at wake-up. Deadlines too far away
/// to represent (such as `.seconds(Int64.max)`) mean "never"; delays that are zero
/// or negative mean "as soon as possible".
///
/// Thread safety: every member may be used from any thread.
public final class SystemTimerScheduler: TimerScheduler {
    /// The scheduler every primitive uses unless told otherwise.
    public static let shared = SystemTimerScheduler()

    /// The engine that keeps this scheduler's entries (SPI).
    @_spi(SchedulerImplementation)
    public let engine = TimerEngine(virtual: false)

    /// Creates a scheduler with its own thread, started at its first arming.
    ///
    /// Most programs need only ``shared``. A separate instance isolates a group of
    /// timers (for example in tests that count ``pendingCount``). Releasing your
    /// reference never drops what is armed on it: every primitive keeps its
    /// scheduler's engine, what is armed still fires, and the thread ends once
    /// nothing is armed any more.
    public init() {}

    deinit {
        engine.retire()
    }
}
