"""A discrete-event simulation in virtual time for what cannot run in real time.

The product's own services (``Provisioner``, ``Reconciler``) run unchanged against a GKE whose
operations take minutes (``gke.SimGke``: per-call latency, a per-cluster limit on concurrent node-pool
operations with GKE's answers beyond it, durations from a seeded distribution), Pub/Sub push
delivery with infra's retry policy and dead-lettering (``push_delivery.SimSubscription``), a scheduler that
repeats FailedScheduling for pods still pending, the reconcile period, and the finished-operation
events. ``scenario.run`` reports the makespan of an S-slice JobSet against ``ceil(S/C) x D``.
Seconds of real time stand for hours of virtual time.
"""
