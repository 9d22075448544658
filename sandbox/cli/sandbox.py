"""``tpuprov demo`` and ``tpuprov sandbox {up,demo}``: run the product end to end on this machine.

A ``tpuprov.commands`` entry point (``sandbox.cli``): the stack is imported only when one of these
commands runs, so ``tpuprov --help`` stays fast. Every one of them runs the real Kubernetes components
(``sandbox.realstack``: built by ``make kube-bins``; root, for a loopback-only network namespace).
"""

from __future__ import annotations

import argparse
from typing import Any

from tpuprov.output import add_output_argument


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topology",
        default="2x2",
        help="basic scenario: v6e slice topology of the TPU JobSet: 2x2 (1 VM per slice, default) or 4x4",
    )
    parser.add_argument(
        "--slices", type=int, default=2, help="basic scenario: number of TPU slices (default 2)"
    )
    parser.add_argument("--run-seconds", type=float, default=5.0, help="how long each pod runs (default 5)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)"
    )
    parser.add_argument(
        "--scenario",
        choices=("basic", "kueue", "fleet"),
        default="kueue",
        help="kueue: the Kueue multislice tutorial (24 v5e chips of quota, JobSets of 3, 1 and 2 v5e 2x4 "
        "slices; default); basic: a TPU and a CPU JobSet, no Kueue; fleet: the Kueue tutorial in two "
        "clusters of two regions at once, served by one deployment",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also print routine lines (acks, no-op decisions)"
    )
    parser.set_defaults(func=run, sandbox_command="demo")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``demo`` and ``sandbox {up,demo}`` to the ``tpuprov`` parser."""
    demo = subparsers.add_parser(
        "demo",
        help="run the whole event loop locally: queued multislice JobSets, pending pods to deleted pools",
        description="Start the local sandbox, run the Kueue multislice flow (or --scenario basic: a TPU and "
        "a CPU JobSet) through it, print the timeline.",
    )
    _demo_arguments(demo)
    sandbox = subparsers.add_parser(
        "sandbox", help="the local sandbox: keep it running, run the demo, or check it with doctor"
    )
    commands = sandbox.add_subparsers(dest="sandbox_command", metavar="{up,demo,doctor}", required=True)
    up = commands.add_parser(
        "up",
        help="start the sandbox (JobSet and Kueue installed) and keep it running until Ctrl-C; prints the "
        "exports and the network-namespace prefix for kubectl and tpuprov",
    )
    up.add_argument("--quiet", action="store_true", help="do not print the live timeline")
    up.add_argument("--gke-op-delay", type=float, default=2.0, help="seconds a node-pool operation takes")
    up.set_defaults(func=run)
    _demo_arguments(commands.add_parser("demo", help="same as `tpuprov demo`"))
    doctor = commands.add_parser(
        "doctor",
        help="start the sandbox, install JobSet and Kueue, run `tpuprov doctor` against it, stop",
    )
    add_output_argument(doctor)
    doctor.set_defaults(func=run)


def run(args: Any) -> int:
    """Dispatch ``demo`` / ``sandbox up`` / ``sandbox demo`` / ``sandbox doctor``; returns the exit code."""
    if args.sandbox_command == "up":
        from sandbox.realstack.up import run_up

        return run_up(gke_op_delay=args.gke_op_delay, quiet=args.quiet)
    if args.sandbox_command == "doctor":
        return _doctor(args.output)
    if args.slices < 1:
        print("tpuprov demo: --slices must be at least 1")
        return 2
    from sandbox.realstack.demo_cli import DemoOptions, main

    options = DemoOptions(
        scenario=args.scenario,
        topology=args.topology,
        slices=args.slices,
        run_seconds=args.run_seconds,
        timeout=args.timeout,
        verbose=args.verbose,
    )
    return main(options)


def _doctor(fmt: str) -> int:
    """The doctor report of a freshly deployed sandbox (every function, JobSet and Kueue installed)."""
    from sandbox.cli.doctor import StackDeployment
    from sandbox.realstack.core import RealStack
    from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
    from shared.app.deployment import TOPIC_PREFIX
    from tpuprov import output
    from tpuprov.doctor.run import diagnose, document, exit_code, render_table
    from tpuprov.doctor.views import Expected

    config = StackConfig(gke_op_delay=0.5, functions=ALL_FUNCTIONS)
    with RealStack(config) as stack:
        stack.setup()
        deployment = StackDeployment(stack, Expected(config.project, TOPIC_PREFIX))
        checks = diagnose(deployment, deployment.expected, deployment.settings)
    output.emit(fmt, document(checks), lambda: render_table(checks))
    return exit_code(checks)
