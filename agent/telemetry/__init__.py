"""GPU and host telemetry sources."""
