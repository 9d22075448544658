"""The local world the provisioner runs in: the real Kubernetes components, emulators for GKE,
Compute, IAM and Cloud Logging, the real Pub/Sub emulator; tests, demo and benchmarks.

Layout: ``kube`` (etcd, kube-apiserver, scheduler, controller manager, KWOK, JobSet and Kueue built
from their Go modules), ``emulators`` (GKE and Compute APIs, IAM, Pub/Sub, Eventarc relay, Cloud
Logging), ``stack`` (configuration, wiring and processes of a stack), ``realstack`` (all of it
running the product), ``sim`` (virtual time), ``bench`` (benchmarks), ``testing`` (fakes, pytest
fixtures) and ``jobsets`` (the JobSets they all submit). Everything binds to 127.0.0.1 only, in a
network namespace with only loopback where the real components run. Nothing here imports ``tpuprov``.
"""
