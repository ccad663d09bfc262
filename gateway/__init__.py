"""Gateway process: configuration, CLI entry point and lifecycle of the broker."""
