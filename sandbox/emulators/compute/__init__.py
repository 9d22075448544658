"""A local emulator of the Compute Engine resource-policy calls (tpu7x workload policies)."""
