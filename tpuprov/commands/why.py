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

    Without ``--fleet-cluster`` the target is looked for in every cluster of the fleet (the
    managed one first); each cluster that holds it is explained, its name before each paragraph
    when the fleet has more than one cluster. ``denial_log`` (a ``tpuprov.denials.DenialLog``)
    replaces the default source of the functions' permission denials."""
    from shared.core.errors import TpuProvError
    from tpuprov import output
    from tpuprov.cluster import fleet_clusters, settings_from

    namespace, _, name = args.target.partition("/")
    if not namespace or not name or "/" in name:
        print("tpuprov why: give NAMESPACE/NAME", file=sys.stderr)
        return 2
    what = f"{'JobSet' if args.jobset else 'pod'} {namespace}/{name}"
    try:
        settings = settings_from(args)
        targets = [settings] if args.fleet_cluster else fleet_clusters(settings)
    except TpuProvError as exc:
        print(f"tpuprov why: {exc.why}", file=sys.stderr)
        return 2
    fleet = len(targets) > 1
    # One paragraph per pod: (cluster, namespace/pod, explanation), printed once everything was read.
    said: list[tuple[str, str, str]] = []
    found = unread = 0
    for target in targets:
        try:
            paragraphs = _explain_in(target, args.jobset, namespace, name)
        except TpuProvError as exc:
            unread += 1
            print(f"tpuprov why: {f'{target.cluster_path}: ' if fleet else ''}{exc.why}", file=sys.stderr)
            continue
        if paragraphs is None:
            continue
        found += 1
        if not paragraphs and args.output == "table":
            said.append(
                (
                    target.cluster_path,
                    "",
                    f"JobSet {namespace}/{name} has no pods (suspended, or not started yet).",
                )
            )
        said += [(target.cluster_path, pod, text) for pod, text in paragraphs]
    if not found:
        if unread == len(targets):
            return 2  # each cluster's reason is said above
        where = ""
        if fleet:
            where = f" in any cluster of the fleet ({len(targets)} clusters"
            where += f", {unread} of them unreadable)" if unread else ")"
        print(f"tpuprov why: {what} not found{where}", file=sys.stderr)
        return 2
    # A role missing a permission blocks every JobSet: said after each explanation until fixed.
    denied = _denials(denial_log if denial_log is not None else _denial_log(settings))
    if denied:
        said = [(cluster, pod, f"{text} {denied}") for cluster, pod, text in said]

    def named(cluster: str, text: str) -> str:
        return f"[{cluster.rsplit('/', 1)[-1]}] {text}" if fleet else text

    doc = [
        {"pod": pod, "explanation": text, **({"cluster": cluster} if fleet else {})}
        for cluster, pod, text in said
        if pod
    ]
    output.emit(args.output, doc, lambda: "".join(f"{named(c, text)}\n" for c, _, text in said))
    return 0


def _explain_in(
    settings: Any, jobset_wanted: bool, namespace: str, name: str
) -> list[tuple[str, str]] | None:
    """The explanations for the target in one cluster, (namespace/pod, paragraph) each; None when
    the cluster does not hold it. Raises TpuProvError when the cluster cannot be read."""
    from shared.core import labels
    from shared.core.errors import NotFoundError
    from shared.tpu.pods import Pod
    from tpuprov.cluster import ClusterView
    from tpuprov.why import MULTIKUEUE_MANAGED_BY, explain, explain_dispatched

    view = ClusterView(settings)
    if jobset_wanted:
        jobset = view.jobset(namespace, name)
        pods = view.pods(namespace, f"{labels.JOBSET_NAME}={name}")
        if jobset is None and not pods:
            return None
        if jobset is not None and not pods and jobset.spec.get("managedBy") == MULTIKUEUE_MANAGED_BY:
            events = view.events_about("JobSet", namespace, name, jobset.meta.uid)
            return [(f"{namespace}/{name}", explain_dispatched(jobset, events))]
        # One pod per slice: the Job's first pod speaks for its pool.
        leaders: dict[tuple[str | None, str | None], Pod] = {}
        for pod in sorted(pods, key=lambda p: p.name):
            key = (pod.labels.get(labels.REPLICATED_JOB_NAME), pod.labels.get(labels.JOB_INDEX))
            leaders.setdefault(key, pod)
        if not leaders:
            return []
        pools, nodes, cluster = view.pools(), view.nodes(), view.cluster()
        return [
            (
                pod.key,
                explain(
                    pod,
                    jobset,
                    view.events_about("Pod", pod.namespace, pod.name, pod.uid),
                    pools,
                    nodes,
                    settings,
                    cluster,
                ),
            )
            for pod in leaders.values()
        ]
    try:
        pod = view.pod(namespace, name)
    except NotFoundError:
        return None
    jobset_name = pod.jobset_value(labels.JOBSET_NAME)
    jobset = view.jobset(namespace, jobset_name) if jobset_name else None
    events = view.events_about("Pod", pod.namespace, pod.name, pod.uid)
    if jobset is not None:
        events += view.events_about("JobSet", namespace, jobset.meta.name, jobset.meta.uid)
    return [(pod.key, explain(pod, jobset, events, view.pools(), view.nodes(), settings, view.cluster()))]
