"""The lowest layer: error taxonomy, settings, structured logs, label keys and deterministic names."""
