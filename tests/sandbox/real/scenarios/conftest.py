"""One real stack for every scenario module of this package (a RealStack costs a minute to start).

``REAL_FAST`` with ``CORDON_SETTLE_SECONDS`` long enough for the cordon race (the wait between the
product's cordon and its last occupancy check must outlast the test's bind), set up once, with the
queues of every module applied by the product's ``apply_kueue``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import ACCELERATOR
from sandbox.testing.stack import real_config

SETTLE = 3
# The packaged default (cluster-queue, 24 chips of v5e 2x4, multislice-queue) and the occupancy
# scenarios' queues: apply prunes what a configuration no longer names, so one holds them all.
QUEUES = f"""
flavors:
  - {{name: vlp-24, accelerator: {ACCELERATOR}, topology: 2x4}}
clusterQueues:
  - name: cluster-queue
    queueingStrategy: BestEffortFIFO
    preemption: {{reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}}
    quota: {{vlp-24: 24}}
  - name: pair-cq
    quota: {{vlp-24: 32}}
  - name: reuse-cq
    quota: {{vlp-24: 16}}
localQueues:
  - {{name: multislice-queue, namespace: default, clusterQueue: cluster-queue}}
  - {{name: pair, namespace: default, clusterQueue: pair-cq}}
  - {{name: reuse, namespace: default, clusterQueue: reuse-cq}}
priorityClasses:
  - {{name: low-priority, value: 100, description: Low priority for jobs that may be preempted.}}
"""


@pytest.fixture(scope="package")
def stack() -> Iterator[RealStack]:
    with RealStack(real_config(CORDON_SETTLE_SECONDS=str(SETTLE))) as running:
        running.setup()
        running.apply_kueue(QUEUES, timeout=120)
        yield running
