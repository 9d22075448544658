"""The local world the provisioner runs in: the real Kubernetes components, emulators for GKE,
Compute, IAM and Cloud Logging, the real Pub/Sub emulator; tests, demo and benchmarks.

Layout: ``emulators`` (GKE API, Kubernetes API, Pub/Sub, Eventarc relay, Cloud Logging), ``cluster``
(simulated JobSet controller, scheduler, nodes), ``stack`` (all of it wired together), ``bench``
(benchmarks), ``testing`` (fakes, pytest fixtures) and ``jobsets`` (the JobSets they all submit).
Everything binds to 127.0.0.1 only.
Nothing here imports ``tpuprov``.
"""
