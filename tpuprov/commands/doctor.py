"""``tpuprov doctor``: check a deployment as deployed; one line per check, exit 1 when any fails."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tpuprov.cluster import add_cluster_arguments
from tpuprov.output import add_output_argument


def register(subparsers: Any) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser(
        "doctor",
        help="check a deployment: APIs, roles, Pub/Sub wiring, sinks, cluster access, JobSet/Kueue, upgrades",
        description="Read the deployed project and cluster and say, per check, OK or what to fix. Reads with "
        "Application Default Credentials; the reachability check acts as the provision function's service "
        "account (impersonation: roles/iam.serviceAccountTokenCreator on it).",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--region", help="Cloud Run region of the functions (default: $REGION)")
    parser.add_argument(
        "--topic-prefix", help="infra variable topic_prefix (default: $TOPIC_PREFIX or tpuprov)"
    )
    parser.add_argument(
        "--delivery",
        choices=("push", "eventarc"),
        help="infra variable delivery (default: $DELIVERY or push)",
    )
    add_output_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0 when every check passes, 1 when one fails, 2 on bad input."""
    from shared.core.errors import TpuProvError
    from tpuprov import output
    from tpuprov.cluster import settings_from
    from tpuprov.doctor.google import GoogleDeployment
    from tpuprov.doctor.run import diagnose, document, exit_code, render_table
    from tpuprov.doctor.views import Expected

    try:
        settings = settings_from(args, narrow=False)  # --fleet-cluster narrows the checks
        region = args.region or os.environ.get("REGION", "")
        if not region:
            raise TpuProvError("which region do the functions run in? give --region (or $REGION)")
        expected = Expected(
            settings.project_id,
            args.topic_prefix or os.environ.get("TOPIC_PREFIX") or "tpuprov",
            args.delivery or os.environ.get("DELIVERY") or "push",
        )
        deployment = GoogleDeployment(settings, expected, region)
        checks = diagnose(deployment, expected, settings, only=args.fleet_cluster)
    except TpuProvError as exc:
        print(f"tpuprov doctor: {exc.why}", file=sys.stderr)
        return 2
    output.emit(args.output, document(checks), lambda: render_table(checks))
    return exit_code(checks)
