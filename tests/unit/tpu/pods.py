"""A pod of a TPU JobSet as the JobSet controller would create it, for the slice and capacity tests."""

from __future__ import annotations

from sandbox.jobsets import tpu_jobset
from shared.tpu.jobsets import expand_pods

UID = "0b9a1c3e-1111-4222-8333-444455556666"


def pod_of(**kwargs):
    jobset = tpu_jobset("train", "team-a", uid=UID, **kwargs)
    return expand_pods(jobset)[0]
