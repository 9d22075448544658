"""Local stand-ins for the cloud and the cluster the provisioner talks to; tests, demo and benchmarks.

Layout: ``emulators`` (GKE API, Kubernetes API, Pub/Sub, Eventarc relay, Cloud Logging), ``cluster``
(simulated JobSet controller, scheduler, nodes), ``stack`` (all of it wired together), ``bench``
(benchmarks), ``testing`` (fakes, pytest fixtures) and ``jobsets`` (the JobSets they all submit).
Everything binds to 127.0.0.1 only.
Nothing here imports ``tpuprov``.
"""
