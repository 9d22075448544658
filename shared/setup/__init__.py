"""Cluster setup: the pinned JobSet/Kueue release manifests and their server-side-apply installer."""
