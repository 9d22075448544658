"""The sandbox ``Deployment``: what a running ``RealStack`` deploys, read as doctor reads Google
(``tpuprov sandbox doctor``).

Pub/Sub is read with the real admin clients on the emulator; the cluster through the GKE emulator and
the real API server as its administrator (the stack's kubeconfig), and reachability as each function:
its own token for the GKE emulator and its own kubeconfig (RBAC-bound token) for the API server. The
roles are the stack's IAM grants (read from infra/roles.json at start, changed by
``stack.iam.revoke``); sinks and their topic grants are the log router's.
"""

from __future__ import annotations

from typing import Any

from sandbox.realstack.core import RealStack
from sandbox.stack.wiring import clients
from shared.cloud.endpoint import choose_endpoint
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import connect
from shared.core.errors import TpuProvError
from shared.core.settings import Settings
from shared.tpu.nodepools import ClusterInfo
from tpuprov.cluster import ClusterView
from tpuprov.doctor.readers import (
    ClusterObjectReads,
    read_subscriptions,
    read_topics,
)
from tpuprov.doctor.views import (
    SETUP_ROLE,
    Expected,
    ReachView,
    RoleView,
    SinkView,
    SubscriptionView,
)


class StackDeployment(ClusterObjectReads):
    """``Deployment`` over a started sandbox stack."""

    def __init__(
        self, stack: RealStack, expected: Expected, control_plane_endpoint: str = "auto", cluster: str = ""
    ) -> None:
        self.stack = stack
        self.expected = expected
        self.plane = stack.plane(cluster) if cluster else stack.home
        self.control_plane_endpoint = control_plane_endpoint
        env = {**stack.env(), "CONTROL_PLANE_ENDPOINT": control_plane_endpoint}
        if self.plane is not stack.home:
            # The fleet cluster's reads as its own administrator would make them: its cluster named
            # as the one to read, its API server's admin kubeconfig (not a deployment of its own).
            target = self.plane.cluster_id
            env.update(
                PROJECT_ID=target.project,
                LOCATION=target.location,
                CLUSTER_NAME=target.name,
                KUBECONFIG=str(self.plane.kube_cluster.kubeconfig),
                FLEET_CLUSTERS="",
                FLEET_OVERRIDES="",
            )
        self.settings = Settings.from_env(env)

    def at(self, cluster: str) -> StackDeployment:
        return StackDeployment(self.stack, self.expected, self.control_plane_endpoint, cluster)

    def function_env(self, function: str) -> dict[str, str]:
        del function  # every function of the sandbox runs with the stack's environment
        return dict(self.stack.env())

    def enabled_services(self) -> frozenset[str]:
        # Each API is "enabled" when the sandbox runs its stand-in.
        s = self.stack
        served = {
            "container.googleapis.com": bool(s.gke.url),
            "compute.googleapis.com": bool(s.compute.url),
            "pubsub.googleapis.com": bool(s.pubsub.host),
            "logging.googleapis.com": s.router is not None,
            "run.googleapis.com": bool(s.function_urls),
        }
        return frozenset(api for api, on in served.items() if on)

    def role(self, function: str) -> RoleView:
        iam = self.stack.iam
        granted = iam.granted(iam.principal_of(function))
        if function not in self.expected.roles:
            # setup_cluster: roles/container.admin is every container.* permission in the sandbox.
            return RoleView(function, SETUP_ROLE, True, frozenset(), bound="container.*" in granted)
        return RoleView(function, self.expected.role_name(function), True, granted, bound=bool(granted))

    def held_in(self, project: str, function: str) -> frozenset[str]:
        iam = self.stack.iam
        return iam.granted(iam.principal_of(function), project)

    def _pubsub(self) -> tuple[Any, Any]:
        return clients(self.stack.pubsub.host)

    def topics(self) -> frozenset[str]:
        publisher, subscriber = self._pubsub()
        try:
            return read_topics(publisher, self.stack.config.project)
        finally:
            publisher.transport.close()
            subscriber.close()

    def subscriptions(self) -> list[SubscriptionView]:
        publisher, subscriber = self._pubsub()
        try:
            return read_subscriptions(subscriber, self.stack.config.project)
        finally:
            publisher.transport.close()
            subscriber.close()

    def function_url(self, function: str) -> str:
        # Pushes reach a function through the relay (the sandbox's Cloud Run front end) once routed.
        return self.stack.relay.url if function in self.stack.function_urls else ""

    def sinks(self) -> list[SinkView]:
        # Each cluster of the sandbox's fleet has its own log router: its sinks and their grants.
        router = self.plane.router
        if router is None:
            return []
        return [SinkView(self.expected.sink_name(s), topic, writer) for s, topic, writer in router.sinks()]

    def topic_publishers(self, topic: str) -> frozenset[str]:
        router = self.plane.router
        return router.publishers(topic) if router is not None else frozenset()

    def cluster(self) -> ClusterInfo:
        return ClusterView(self.settings).gke.get_cluster(self.settings.cluster_path)

    def reach(self, function: str) -> ReachView:
        token = self.stack.iam.token_for(function)
        gke = GkeNodePoolAPI(endpoint=self.stack.gke.url, access_token=token)
        endpoint = ""
        try:
            chosen = choose_endpoint(
                gke.get_cluster(self.settings.cluster_path), self.settings.control_plane_endpoint
            )
            endpoint = f"{chosen.kind} {chosen.host.removeprefix('https://')}"
            # The sandbox's one API server stands for whichever endpoint was chosen; the function
            # reaches it with its own kubeconfig, as the stack deploys it.
            kubeconfig = str(self.plane.kube_cluster.kubeconfig_for(function))
            as_function = self.settings.with_overrides(emulator_access_token=token, kubeconfig=kubeconfig)
            connect(as_function, lambda: gke).list_pods("default")
        except TpuProvError as exc:
            return ReachView(function, endpoint, exc.why)
        return ReachView(function, endpoint, "")
