import SafeTimers
