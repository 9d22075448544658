"""Simulated in-cluster components: the JobSet controller, the scheduler and node mirroring."""
