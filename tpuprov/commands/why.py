"""``tpuprov why NAMESPACE/POD`` (or ``--jobset NAMESPACE/NAME``): why a pod has its TPU slice, or not."""

from __future__ import annotations

import argparse
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


def run(args: argparse.Namespace) -> int:
    """Print the explanation; exit 2 when the target is malformed or missing."""
    from shared.core import labels
    from shared.core.errors import NotFoundError, TpuProvError
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
            leaders: dict[tuple[Any, Any], dict[str, Any]] = {}
            for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
                pod_labels = (pod.get("metadata") or {}).get("labels") or {}
                key = (pod_labels.get(labels.REPLICATED_JOB_NAME), pod_labels.get(labels.JOB_INDEX))
                leaders.setdefault(key, pod)
            if not leaders and args.output == "table":
                print(f"JobSet {namespace}/{name} has no pods (suspended, or not started yet).")
                return 0
            pools, nodes = view.pools(), view.nodes()
            for pod in leaders.values():
                pod = {"apiVersion": "v1", "kind": "Pod", **pod}
                explained = explain(pod, jobset, view.events_about(pod), pools, nodes, settings)
                said.append((f"{namespace}/{pod['metadata'].get('name', '')}", explained))
        else:
            try:
                pod = {"apiVersion": "v1", "kind": "Pod", **view.pod(namespace, name)}
            except NotFoundError:
                print(f"tpuprov why: pod {namespace}/{name} not found", file=sys.stderr)
                return 2
            jobset_name = ((pod.get("metadata") or {}).get("labels") or {}).get(labels.JOBSET_NAME)
            jobset = view.jobset(namespace, jobset_name) if jobset_name else None
            events = view.events_about(pod)
            if jobset is not None:
                events += view.events_about({"apiVersion": "", "kind": "JobSet", **jobset})
            said.append(
                (f"{namespace}/{name}", explain(pod, jobset, events, view.pools(), view.nodes(), settings))
            )
    except TpuProvError as exc:
        print(f"tpuprov why: {exc.why}", file=sys.stderr)
        return 2
    doc = [{"pod": pod_name, "explanation": text} for pod_name, text in said]
    output.emit(args.output, doc, lambda: "".join(f"{text}\n" for _, text in said))
    return 0
