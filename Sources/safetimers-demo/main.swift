print("SafeTimers demo")
