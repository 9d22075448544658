"""Buying: the one route from a group of slices to GKE's creates (``engine``), and what it runs on.

``groups`` (a slice's pool spec per capacity option, the creates of a group), ``slots`` and
``fanout`` (GKE's operation slots and request quota, the rounds of a fan-out), ``policies`` (the
tpu7x workload policies a create names), ``fallback`` and ``backoff`` (a failed attempt falls back to
the next capacity option or waits), ``known`` (pools seen to exist, single flight per group).
"""
