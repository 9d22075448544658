"""``tpuprov publish``: send a test message to a deployed (or emulated) provisioner topic.

Builds the same message a log sink would export -- a pending pod's FailedScheduling, a JobSet's
terminal Event, a JobSet deletion audit entry -- or the manual setup / Kueue messages, publishes it
to "<topic prefix>-<topic>" and prints the message id. Inputs are validated first: a bad name exits
with status 2 and publishes nothing. With PUBSUB_EMULATOR_HOST set it talks to the emulator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from shared.core.errors import InvalidInputError, PermanentError, TransientError
from shared.core.settings import Settings
from tpuprov import output, publish
from tpuprov.waits import wait_for_kueue, wait_for_setup

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _common(parser: argparse.ArgumentParser, defaults: dict[str, str]) -> None:
    group = parser.add_argument_group(
        "deployment (defaults from PROJECT_ID, LOCATION, CLUSTER_NAME, TOPIC_PREFIX)"
    )
    group.add_argument("--project", default=defaults["project"], help="project of the cluster and the topics")
    group.add_argument("--location", default=defaults["location"], help="cluster location (region or zone)")
    group.add_argument(
        "--cluster",
        default=defaults["cluster"],
        help="cluster name, or its full path projects/P/locations/L/clusters/C",
    )
    group.add_argument("--topic-prefix", default=defaults["topic_prefix"], help="topic name prefix")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the message instead of publishing it (as a gcloud command with -o table)",
    )
    output.add_output_argument(parser)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``publish`` and its sub-commands to an ``argparse`` sub-parsers object; sets ``func=run``."""
    settings = Settings.from_env()
    defaults = {
        "project": settings.project_id,
        "location": settings.location,
        "cluster": settings.cluster_name,
        "topic_prefix": os.environ.get("TOPIC_PREFIX", publish.DEFAULT_TOPIC_PREFIX),
    }
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help="publish a test message (pending pod, JobSet finished/deleted, setup, Kueue)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)

    pod = kinds.add_parser("pending-pod", help="a pending pod's FailedScheduling event (provision)")
    pod.add_argument("--namespace", required=True)
    pod.add_argument("--pod", required=True, help="pod name")
    pod.add_argument("--uid", default="", help="pod UID (omitted when not given)")
    pod.add_argument("--jobset", default="", help="owning JobSet, added as GKE's controller labels")
    pod.add_argument(
        "--reason", default="FailedScheduling", choices=("FailedScheduling", "NotTriggerScaleUp")
    )

    finished = kinds.add_parser("jobset-finished", help="a JobSet's terminal event (release)")
    finished.add_argument("--namespace", required=True)
    finished.add_argument("--name", required=True, help="JobSet name")
    finished.add_argument("--uid", default="", help="JobSet UID (omitted when not given)")
    finished.add_argument("--failed", action="store_true", help="FailedJobs instead of AllJobsCompleted")

    deleted = kinds.add_parser("jobset-deleted", help="the audit entry of a JobSet deletion (release)")
    deleted.add_argument("--namespace", required=True)
    deleted.add_argument("--name", required=True, help="JobSet name")
    deleted.add_argument("--principal", default="", help="who deleted it (default: a placeholder user)")

    setup = kinds.add_parser("setup", help='{"cluster": ...}: install JobSet and Kueue (setup_cluster)')
    setup.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="then follow the install on the cluster until JobSet and Kueue are Available (0: do not wait)",
    )

    kueue = kinds.add_parser(
        "kueue",
        help="a Kueue queue configuration (apply_kueue), for the cluster --location/--cluster name "
        "(its cluster attribute: any cluster of the fleet), else the deployment's own",
    )
    kueue.add_argument("-f", "--file", required=True, help="YAML or JSON configuration, - for stdin")
    kueue.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="then follow the apply on the cluster (needs --location and --cluster) until its Kueue "
        "objects are exactly the configuration's (0: do not wait)",
    )

    for sub in (pod, finished, deleted, setup, kueue):
        _common(sub, defaults)
        sub.set_defaults(func=run)
    return parser


def _prepare(args: argparse.Namespace) -> tuple[publish.Prepared, str]:
    """The message for ``args`` and the project whose topic receives it."""
    if args.kind == "kueue":
        # Without --cluster the Kueue function applies to the cluster it is deployed for, so only the
        # topic's project matters; with it, the message's cluster attribute names a fleet cluster.
        if not args.project:
            raise InvalidInputError("give --project (or set PROJECT_ID): the project of the Kueue topic")
        named = bool(args.cluster) and (bool(args.location) or args.cluster.startswith("projects/"))
        target = publish.cluster_id(args.cluster, args.project, args.location) if named else None
        text = _read(args.file)
        return publish.kueue(text, Settings.from_env().allowed_accelerators, target), args.project
    cluster = publish.cluster_id(args.cluster or "", args.project, args.location)
    project = args.project or cluster.project
    if args.kind == "pending-pod":
        prepared = publish.pending_pod(cluster, args.namespace, args.pod, args.uid, args.reason, args.jobset)
    elif args.kind == "jobset-finished":
        prepared = publish.jobset_finished(cluster, args.namespace, args.name, args.uid, args.failed)
    elif args.kind == "jobset-deleted":
        prepared = publish.jobset_deleted(cluster, args.namespace, args.name, args.principal)
    else:
        prepared = publish.setup(cluster)
    return prepared, project


def _read(name: str) -> str:
    try:
        return sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read {name}: {exc}") from None


def _wait_settings(args: argparse.Namespace) -> Settings | None:
    """The cluster ``--wait`` follows (checked before anything is published), or None without a wait."""
    if getattr(args, "wait", 0) <= 0:
        return None
    cluster = publish.cluster_id(args.cluster or "", args.project, args.location)
    return Settings.from_env().with_overrides(
        project_id=cluster.project, location=cluster.location, cluster_name=cluster.name
    )


def _message_doc(path: str, prepared: publish.Prepared) -> dict[str, Any]:
    try:
        body: Any = json.loads(prepared.data)
    except ValueError:
        body = prepared.data.decode("utf-8", errors="replace")
    return {"topic": path, "attributes": dict(prepared.attributes), "data": body}


def run(args: argparse.Namespace, publisher: publish.Publisher | None = None) -> int:
    """Validate, build and publish one message; 0 on success, 2 for bad input, 1 if publishing failed."""
    try:
        prepared, project = _prepare(args)
        path = publish.topic_path(project, args.topic_prefix, prepared)
        wait_settings = _wait_settings(args)
    except InvalidInputError as exc:
        print(f"tpuprov publish: {exc.why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.dry_run:
        output.emit(
            args.output, _message_doc(path, prepared), lambda: publish.gcloud_command(prepared, path) + "\n"
        )
        return EXIT_OK
    owned = publisher is None
    client: publish.Publisher = publish.PubsubPublisher() if publisher is None else publisher
    try:
        result = publish.publish(prepared, project, args.topic_prefix, client)
    except (PermanentError, TransientError) as exc:
        print(f"tpuprov publish: {exc.why}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if owned and isinstance(client, publish.PubsubPublisher):
            client.close()
    output.emit(
        args.output,
        {"kind": result.kind, "topic": result.topic_path, "message_id": result.message_id},
        lambda: f"published {result.kind} to {result.topic_path}: message id {result.message_id}\n",
    )
    if wait_settings is None:
        return EXIT_OK
    sys.stdout.flush()  # the message id before the progress lines
    try:
        if args.kind == "kueue":
            done = wait_for_kueue(wait_settings, prepared.data.decode("utf-8"), args.wait)
        else:
            done = wait_for_setup(wait_settings, args.wait)
    except (PermanentError, TransientError) as exc:
        print(f"tpuprov publish: cannot follow the outcome: {exc.why}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK if done else EXIT_FAILED
