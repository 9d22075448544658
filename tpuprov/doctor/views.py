"""What ``tpuprov doctor`` reads about a deployment: small frozen views and the port that yields them.

The checks (``tpuprov.doctor.checks``) are pure functions of these views. Two adapters implement
``Deployment``: ``tpuprov.doctor.google`` over Google's APIs, and ``sandbox.cli.doctor`` over a
running sandbox stack. What the deployment *should* be comes from the same files Terraform applies
(``infra/roles.json``) and the Terraform-checked restatement of ``infra/main.tf`` that the sandbox
also deploys by (``shared.app.deployment``), so doctor, the sandbox and infra cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import resources
from typing import Protocol

from shared.app.deployment import FUNCTIONS, SINKS, FunctionWiring, service_account
from shared.setup.manifests import Component
from shared.tpu.nodepools import ClusterInfo

# infra/iam.tf gives setup_cluster this predefined role instead of a custom one.
SETUP_ROLE = "roles/container.admin"
PUBLISHER_ROLE = "roles/pubsub.publisher"


def function_roles() -> dict[str, tuple[str, ...]]:
    """Each function's custom role as infra/roles.json declares it (a link to that file ships in
    the package as ``tpuprov/data/roles.json``: one file, read by Terraform and by doctor)."""
    text = resources.files("tpuprov").joinpath("data/roles.json").read_text(encoding="utf-8")
    return {function: tuple(permissions) for function, permissions in json.loads(text).items()}


@dataclasses.dataclass(frozen=True)
class Expected:
    """The deployment infra/ describes for one project and topic prefix."""

    project: str
    prefix: str = "tpuprov"
    delivery: str = "push"  # infra variable `delivery`: "push" or "eventarc"
    roles: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=function_roles)
    functions: tuple[FunctionWiring, ...] = FUNCTIONS
    sinks: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(SINKS))

    def service_account(self, function: str) -> str:
        """The runtime service account infra/iam.tf creates for ``function``."""
        return service_account(function, self.project, self.prefix)

    def role_name(self, function: str) -> str:
        """The role infra/iam.tf binds to ``function``'s service account."""
        if function not in self.roles:
            return SETUP_ROLE
        return f"projects/{self.project}/roles/{self.prefix.replace('-', '_')}_{function}"

    def service(self, function: str) -> str:
        """The Cloud Run service name of ``function`` (infra/main.tf)."""
        return f"{self.prefix}-{function.replace('_', '-')}"

    def topic_path(self, topic: str) -> str:
        """``projects/P/topics/T``."""
        return f"projects/{self.project}/topics/{topic}"

    def sink_name(self, sink: str) -> str:
        """The log sink's name (infra/main.tf: ``<prefix>-<file name>``)."""
        return f"{self.prefix}-{sink}"

    def apis(self) -> tuple[str, ...]:
        """The services the product calls or is delivered through."""
        base = (
            "container.googleapis.com",
            "compute.googleapis.com",
            "run.googleapis.com",
            "pubsub.googleapis.com",
            "logging.googleapis.com",
        )
        return base + (("eventarc.googleapis.com",) if self.delivery == "eventarc" else ())


@dataclasses.dataclass(frozen=True)
class RoleView:
    """The role bound to one function's service account as IAM has it."""

    function: str
    role: str  # projects/P/roles/R or roles/...
    exists: bool  # False: no such (custom) role, or it is deleted
    permissions: frozenset[str]  # includedPermissions ("" for predefined roles: not read)
    bound: bool  # the project's IAM policy binds the role to the service account


@dataclasses.dataclass(frozen=True)
class SubscriptionView:
    """A Pub/Sub subscription as the admin API reports it."""

    name: str  # short name
    topic: str  # short name ("_deleted-topic_" when its topic is gone)
    push_endpoint: str
    dead_letter_topic: str  # short name, "" without a dead-letter policy
    max_delivery_attempts: int


@dataclasses.dataclass(frozen=True)
class SinkView:
    """A log sink: where it exports and as whom."""

    name: str
    topic: str  # short name of the destination topic ("" when it is not a Pub/Sub topic)
    writer_identity: str  # "serviceAccount:..."


@dataclasses.dataclass(frozen=True)
class ReachView:
    """Reaching the cluster's Kubernetes API as a function would."""

    function: str
    endpoint: str  # "<kind> <address>" the configured CONTROL_PLANE_ENDPOINT picks, "" if none
    error: str  # "" when a read answered


@dataclasses.dataclass(frozen=True)
class AddonView:
    """One add-on controller Deployment (JobSet's or Kueue's)."""

    component: str
    deployment: str  # namespace/name
    installed: bool
    version: str  # what runs: the installer's stamp, else the image tag
    available: bool


@dataclasses.dataclass(frozen=True)
class AdmissionCheckView:
    """The product's Kueue AdmissionCheck and the ClusterQueues that name it."""

    name: str
    exists: bool
    active: bool
    message: str  # its Active condition's message (or why it is not Active)
    queues: tuple[str, ...]  # ClusterQueues whose admissionChecksStrategy names it


class Deployment(Protocol):
    """What doctor reads about a deployment. Every method may raise ``TpuProvError`` with the reason."""

    def enabled_services(self) -> frozenset[str]:
        """The project's enabled services (``container.googleapis.com``...)."""
        ...

    def role(self, function: str) -> RoleView:
        """The role bound to ``function``'s service account."""
        ...

    def held_in(self, project: str, function: str) -> frozenset[str]:
        """The permissions the roles bound to ``function``'s service account in ``project`` grant."""
        ...

    def topics(self) -> frozenset[str]:
        """Short names of the project's topics."""
        ...

    def subscriptions(self) -> list[SubscriptionView]:
        """The project's subscriptions."""
        ...

    def function_url(self, function: str) -> str:
        """The base URL Pub/Sub pushes to for ``function`` ("" when its service does not exist)."""
        ...

    def sinks(self) -> list[SinkView]:
        """The project's log sinks."""
        ...

    def topic_publishers(self, topic: str) -> frozenset[str]:
        """Members holding roles/pubsub.publisher on ``topic``."""
        ...

    def cluster(self) -> ClusterInfo:
        """The managed cluster as GKE reports it."""
        ...

    def reach(self, function: str) -> ReachView:
        """Read from the cluster's Kubernetes API as ``function``."""
        ...

    def addon(self, component: Component) -> AddonView:
        """The add-on's controller Deployment."""
        ...

    def admission_check(self, name: str) -> AdmissionCheckView:
        """The product's AdmissionCheck ``name`` and the ClusterQueues using it."""
        ...

    def function_env(self, function: str) -> dict[str, str]:
        """The environment ``function`` runs with (its settings as deployed)."""
        ...

    def at(self, cluster: str) -> Deployment:
        """This deployment with its cluster reads (``cluster``, ``reach``, ``addon``,
        ``admission_check``) and its sinks on the fleet cluster ``cluster`` (a cluster path): the
        sinks that export that cluster's entries (its project's) and their grants."""
        ...
