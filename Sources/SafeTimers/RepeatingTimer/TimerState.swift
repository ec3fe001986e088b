/// The states of a ``RepeatingTimer``.
///
/// ```
///            start()              suspend()
///   .idle ───────────▶ .running ───────────▶ .suspended
///     │                │  ▲  ◀───────────────     │
///     │                │  │      resume()         │
///     │    last repetition  │ start()             │
///     │                ▼  │                       │
///     │            .finished                      │
///     │                │ cancel()                 │
///     └── cancel() ───▶ .cancelled ◀── cancel() ──┘
///                      │ start() ─▶ .running
/// ```
public enum TimerState: Sendable, Hashable, CustomStringConvertible {
    /// Created, never started.
    case idle
    /// Ticking.
    case running
    /// Paused by `suspend()`; `resume()` continues.
    case suspended
    /// Stopped by `cancel()` (or by the release of its owner); `start()` restarts.
    case cancelled
    /// Stopped after its last repetition; `start()` restarts.
    case finished

    /// The state's name.
    public var description: String {
        switch self {
        case .idle: "idle"
        case .running: "running"
        case .suspended: "suspended"
        case .cancelled: "cancelled"
        case .finished: "finished"
        }
    }
}
