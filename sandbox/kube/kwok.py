"""KWOK's configuration in the sandbox: it plays the kubelet of every Node, through these Stages.

KWOK runs no containers. Its Stages say how a kubelet would move an object's status on: a Node it
manages becomes Ready, a pod bound to one becomes Running, and a pod whose template carries
``sandbox.tpuprov.dev/run-seconds`` ends that many seconds later, Succeeded, or Failed while its
JobSet restart attempt is below ``sandbox.tpuprov.dev/fail-until-attempt`` (the same annotations
the scenario builders put on pod templates). A pod without ``run-seconds`` runs until deleted.
A pod being deleted is removed, as a kubelet confirms a graceful deletion.

Stage selectors and delays are jq expressions over the object (KWOK's ``expressionFrom``).
"""

from __future__ import annotations

from typing import Any

import yaml

RUN_SECONDS = "sandbox.tpuprov.dev/run-seconds"
FAIL_UNTIL_ATTEMPT = "sandbox.tpuprov.dev/fail-until-attempt"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"

_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_NOT_DELETED: dict[str, Any] = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
# True while this attempt is one the template says must fail (both values are strings on the object).
_MUST_FAIL = (
    f'((.metadata.annotations["{FAIL_UNTIL_ATTEMPT}"] // "0") | tonumber) > '
    f'((.metadata.labels["{RESTART_ATTEMPT}"] // "0") | tonumber)'
)
_RUNNING_ENDS: list[dict[str, Any]] = [
    _NOT_DELETED,
    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
    {"key": f'.metadata.annotations["{RUN_SECONDS}"]', "operator": "Exists"},
]
# Seconds on the pod, a Go duration for KWOK ("30" -> "30s").
_RUN_DELAY = {"durationFrom": {"expressionFrom": f'(.metadata.annotations["{RUN_SECONDS}"]) + "s"'}}

_NODE_READY_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
- address: {{ NodeIP | Quote }}
  type: InternalIP
- address: {{ NodeName | Quote }}
  type: Hostname
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: ""
  containerRuntimeVersion: kwok
  osImage: kwok
phase: Running
"""

_NODE_HEARTBEAT_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

_POD_RUNNING_STATUS = """\
{{ $now := Now }}
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
{{ $m := .metadata }}
podIP: {{ PodIPWith .spec.nodeName false (or $m.uid "") (or $m.name "") (or $m.namespace "") | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _pod_ended_status(phase: str, exit_code: int, reason: str) -> str:
    # A kubelet reports a finished pod not Ready (reason PodCompleted) with terminated containers.
    return f"""\
{{{{ $now := Now }}}}
conditions:
- {{type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
- {{type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
containerStatuses:
{{{{ range .spec.containers }}}}
- name: {{{{ .name | Quote }}}}
  image: {{{{ .image | Quote }}}}
  ready: false
  started: false
  restartCount: 0
  state: {{terminated: {{exitCode: {exit_code}, reason: {reason}, finishedAt: {{{{ $now | Quote }}}}}}}}
{{{{ end }}}}
phase: {phase}
"""


def _stage(name: str, kind: str, selector: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": selector},
            **spec,
        },
    }


def stages() -> list[dict[str, Any]]:
    """The Node and Pod Stages (see the module docstring)."""
    ready_true = {"key": _READY, "operator": "In", "values": ["True"]}
    return [
        _stage(
            "node-ready",
            "Node",
            [{"key": _READY, "operator": "NotIn", "values": ["True"]}],
            {"next": {"statusTemplate": _NODE_READY_STATUS}},
        ),
        # Leases carry liveness; the Ready condition is refreshed now and then, as a kubelet does.
        _stage(
            "node-heartbeat",
            "Node",
            [ready_true],
            {"delay": {"durationMilliseconds": 60000}, "next": {"statusTemplate": _NODE_HEARTBEAT_STATUS}},
        ),
        _stage(
            "pod-running",
            "Pod",
            [
                _NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {"key": _READY, "operator": "NotIn", "values": ["True"]},
            ],
            {"next": {"statusTemplate": _POD_RUNNING_STATUS}},
        ),
        _stage(
            "pod-succeeded",
            "Pod",
            [*_RUNNING_ENDS, {"key": _MUST_FAIL, "operator": "NotIn", "values": ["true"]}],
            {"delay": _RUN_DELAY, "next": {"statusTemplate": _pod_ended_status("Succeeded", 0, "Completed")}},
        ),
        _stage(
            "pod-failed",
            "Pod",
            [*_RUNNING_ENDS, {"key": _MUST_FAIL, "operator": "In", "values": ["true"]}],
            {"delay": _RUN_DELAY, "next": {"statusTemplate": _pod_ended_status("Failed", 1, "Error")}},
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"next": {"delete": True}},
        ),
    ]


def config_yaml(server_address: str) -> str:
    """KWOK's ``--config`` file: manage every Node (all are fake here), plus the Stages."""
    configuration = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        # KWOK's documented defaults, spelled out: they are not applied to a configuration file.
        "options": {
            "manageAllNodes": True,
            "serverAddress": server_address,
            "cidr": "10.0.0.0/24",
            "nodeLeaseDurationSeconds": 40,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "enableDebuggingHandlers": False,
            "enableProfilingHandler": False,
        },
    }
    return yaml.safe_dump_all([configuration, *stages()], sort_keys=False)
