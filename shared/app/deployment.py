"""How the functions are deployed: their topics, push subscriptions, delivery policy, sinks and accounts.

``infra/main.tf`` and ``infra/modules/*`` declare, per function, a source topic
(``<prefix>-<suffix>``) with a dead-letter topic beside it, a push subscription with a retry policy
and a dead-letter policy, and a service account ``<prefix>-<short>``; ``sinks/`` fills the topics.
This module restates those facts once, for the readers that must agree with the Terraform:
``tpuprov doctor`` checks a live deployment against them, the sandbox deploys its emulated
functions by them, and ``tests/sandbox/test_wiring.py`` and ``tests/cli/test_doctor_infra.py``
parse the Terraform and fail when the two drift apart. Pure data: no client library here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

TOPIC_PREFIX = "tpuprov"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """A push subscription's redelivery backoff (Pub/Sub doubles from the minimum up to the maximum)."""

    minimum_backoff_seconds: int
    maximum_backoff_seconds: int


@dataclasses.dataclass(frozen=True)
class FunctionWiring:
    """One event function as infra deploys it: its source topic suffix, request timeout and account."""

    function: str
    topic_suffix: str
    timeout_seconds: int
    account: str  # infra: local.functions[<function>].short, the service account "<prefix>-<account>"

    def topic(self, prefix: str = TOPIC_PREFIX) -> str:
        """The function's source topic name."""
        return f"{prefix}-{self.topic_suffix}"

    def dead_letter_topic(self, prefix: str = TOPIC_PREFIX) -> str:
        """Where messages go after the last delivery attempt."""
        return f"{self.topic(prefix)}-dead-letter"

    def subscription(self, prefix: str = TOPIC_PREFIX) -> str:
        """The push subscription feeding the function (infra: ``<service name>-push``)."""
        return f"{prefix}-{self.function.replace('_', '-')}-push"

    def dead_letter_subscription(self, prefix: str = TOPIC_PREFIX) -> str:
        """The pull subscription that keeps dead letters for inspection."""
        return f"{self.dead_letter_topic(prefix)}-pull"

    @property
    def ack_deadline_seconds(self) -> int:
        """infra: ``min(600, timeout_seconds)``, so a slow call is not redelivered while it runs."""
        return min(600, self.timeout_seconds)


INFRA_RETRY_POLICY = RetryPolicy(minimum_backoff_seconds=10, maximum_backoff_seconds=600)
INFRA_MAX_DELIVERY_ATTEMPTS = 10
FUNCTIONS: tuple[FunctionWiring, ...] = (
    FunctionWiring("provision", "pending-pods", 60, "provision"),
    FunctionWiring("release", "jobset-lifecycle", 120, "release"),
    FunctionWiring("reconcile", "reconcile", 300, "reconcile"),
    FunctionWiring("setup_cluster", "setup", 540, "setup"),
    FunctionWiring("apply_kueue", "kueue", 300, "kueue"),
)
# sinks/<name>.filter -> the function whose topic the sink fills.
SINKS: Mapping[str, str] = {
    "pending-tpu-pods": "provision",
    "nodepool-operations": "provision",
    "workload-quota-reserved": "provision",
    "jobset-lifecycle": "release",
    "cluster-created": "setup_cluster",
}
DEAD_LETTER_ACK_DEADLINE_SECONDS = 60
# Each function's service account short name (infra/main.tf: "<prefix>-<short>").
ACCOUNTS: Mapping[str, str] = {f.function: f.account for f in FUNCTIONS}


def wiring(function: str) -> FunctionWiring:
    """The wiring of one function by name; KeyError for an unknown one."""
    for item in FUNCTIONS:
        if item.function == function:
            return item
    raise KeyError(f"unknown function {function!r}; known: {', '.join(f.function for f in FUNCTIONS)}")


# The sinks' ``${clusters}`` clause in a FLEET_PROJECTS project: every cluster's entries (a
# cluster may be labelled into the fleet at any time; the functions drop the unlabelled ones).
# Logging's ``:*`` is the presence test (Logging query language, "Comparisons").
ANY_CLUSTER = "resource.labels.cluster_name:*"


def sink_clusters(cluster_paths: Iterable[str]) -> str:
    """The sinks' ``${clusters}`` clause: the LogEntries of these clusters (``resource.labels``
    location and cluster_name) and of no other, as infra/main.tf's ``sink_template_vars`` writes it
    for the fleet (the managed cluster, then ``fleet_clusters``)."""
    each = []
    for path in dict.fromkeys(cluster_paths):
        _, _, _, location, _, name = path.split("/")
        each.append(f'(resource.labels.location="{location}" AND resource.labels.cluster_name="{name}")')
    return f"({' OR '.join(each)})"


def service_account(function: str, project: str, prefix: str = TOPIC_PREFIX) -> str:
    """The email of the service account ``function`` runs as."""
    return f"{prefix}-{ACCOUNTS.get(function, function)}@{project}.iam.gserviceaccount.com"
