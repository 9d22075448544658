"""``tpuprov why NAMESPACE/POD`` (or ``--jobset NAMESPACE/NAME``): why a pod has its TPU slice, or not."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tpuprov.cluster import add_cluster_arguments
from tpuprov.output import add_output_argument


def register(subparsers: Any) -> None:
    """Add the ``why`` subcommand."""
    parser = subparsers.add_parser(
        "why",
        help="explain in one paragraph why a pod (or each slice of a JobSet) has or has no TPU pool",
    )
    parser.add_argument("target", help="NAMESPACE/POD, or NAMESPACE/NAME with --jobset")
    parser.add_argument("--jobset", action="store_true", help="the target is a JobSet: explain each slice")
    add_cluster_arguments(parser)
    add_output_argument(parser)
    parser.set_defaults(func=run)


def _denial_log(settings: Any) -> Any:
    """Production reads the functions' permission.denied lines from Cloud Logging, the sandbox from its
    function log files; against other emulators there is no log to read."""
    from tpuprov.denials import CloudLoggingDenials, LogFileDenials

    if os.environ.get("SANDBOX_LOG_DIR"):
        return LogFileDenials(os.environ["SANDBOX_LOG_DIR"])
    if settings.gke_api_endpoint or settings.kube_api_endpoint:
        return None
    return CloudLoggingDenials(settings.project_id, os.environ.get("TOPIC_PREFIX") or "tpuprov")


def _denials(log: Any) -> str:
    from shared.core.errors import TpuProvError
    from tpuprov.denials import sentence

    if log is None:
        return ""
    try:
        return sentence(log.denials())
    except TpuProvError as exc:
        print(f"tpuprov why: {exc.why}", file=sys.stderr)  # the explanation stands without it
        return ""


def run(args: argparse.Namespace, denial_log: Any = None) -> int:
    """Print the explanation; exit 2 when the target is malformed or missing.

    ``denial_log`` (a ``tpuprov.denials.DenialLog``) replaces the default source of the functions'
    permission denials."""
    from shared.core import labels
    from shared.core.errors import NotFoundError, TpuProvError
    from shared.tpu.pods import Pod
    from tpuprov import output
    from tpuprov.cluster import ClusterView, settings_from
    from tpuprov.why import explain

    # One paragraph per pod: (namespace/pod, explanation), printed once everything was read.
    said: list[tuple[str, str]] = []
    namespace, _, name = args.target.partition("/")
    if not namespace or not name or "/" in name:
        print("tpuprov why: give NAMESPACE/NAME", file=sys.stderr)
        return 2
    try:
        settings = settings_from(args)
        view = ClusterView(settings)
        if args.jobset:
            jobset = view.jobset(namespace, name)
            pods = view.pods(namespace, f"{labels.JOBSET_NAME}={name}")
            if jobset is None and not pods:
                print(f"tpuprov why: JobSet {namespace}/{name} not found", file=sys.stderr)
                return 2
            # One pod per slice: the Job's first pod speaks for its pool.
            leaders: dict[tuple[str | None, str | None], Pod] = {}
            for pod in sorted(pods, key=lambda p: p.name):
                key = (pod.labels.get(labels.REPLICATED_JOB_NAME), pod.labels.get(labels.JOB_INDEX))
                leaders.setdefault(key, pod)
            if not leaders and args.output == "table":
                print(f"JobSet {namespace}/{name} has no pods (suspended, or not started yet).")
                return 0
            pools, nodes, cluster = view.pools(), view.nodes(), view.cluster()
            for pod in leaders.values():
                events = view.events_about("Pod", pod.namespace, pod.name, pod.uid)
                explained = explain(pod, jobset, events, pools, nodes, settings, cluster)
                said.append((pod.key, explained))
        else:
            try:
                pod = view.pod(namespace, name)
            except NotFoundError:
                print(f"tpuprov why: pod {namespace}/{name} not found", file=sys.stderr)
                return 2
            jobset_name = pod.jobset_value(labels.JOBSET_NAME)
            jobset = view.jobset(namespace, jobset_name) if jobset_name else None
            events = view.events_about("Pod", pod.namespace, pod.name, pod.uid)
            if jobset is not None:
                events += view.events_about("JobSet", namespace, jobset.meta.name, jobset.meta.uid)
            explained = explain(pod, jobset, events, view.pools(), view.nodes(), settings, view.cluster())
            said.append((pod.key, explained))
    except TpuProvError as exc:
        print(f"tpuprov why: {exc.why}", file=sys.stderr)
        return 2
    # A role missing a permission blocks every JobSet: said after each explanation until fixed.
    denied = _denials(denial_log if denial_log is not None else _denial_log(settings))
    if denied:
        said = [(pod_name, f"{text} {denied}") for pod_name, text in said]
    doc = [{"pod": pod_name, "explanation": text} for pod_name, text in said]
    output.emit(args.output, doc, lambda: "".join(f"{text}\n" for _, text in said))
    return 0
