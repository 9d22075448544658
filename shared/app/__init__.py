"""The Cloud Run face: the one entry point mapping outcomes to HTTP answers, and the per-function handlers."""
