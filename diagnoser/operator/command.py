"""`diagnoser operator`: the reference operator's composition root (registered by the CLI).

Exit codes: 0 stopped by SIGTERM/SIGINT after the in-flight cordons and restarts reported;
2 bad usage (an unknown kind, no usable kubeconfig, the `operator` extra not installed)."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import socket
from dataclasses import replace
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from diagnoser.operator.wire import ActionKind, WorkloadKind

err = Console(stderr=True, highlight=False, soft_wrap=True)
DEFAULT_KINDS = "cordon_node,uncordon_node,restart_job,verify_nodes"


def _fail(message: str) -> typer.Exit:
    err.print(Text.assemble(("error:", "bold red"), " ", message))
    return typer.Exit(2)


def parse_kinds(values: list[str]) -> tuple[ActionKind, ...]:
    """`--kinds a,b --kinds c` and `DIAGNOSER_OPERATOR_KINDS=a,b` alike; order kept, no repeats."""
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    known = {kind.value for kind in ActionKind}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise _fail(f"unknown action kind {unknown[0]!r} (known: {', '.join(sorted(known))})")
    if ActionKind.NOTIFY.value in names:
        raise _fail("notify actions are delivered by the service's notifier, not the operator")
    return tuple(ActionKind(name) for name in dict.fromkeys(names))


def parse_workloads(value: str) -> frozenset[WorkloadKind]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    known = {kind.value for kind in WorkloadKind}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise _fail(f"unknown workload kind {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return frozenset(WorkloadKind(name) for name in names)


def operator(
    server: Annotated[
        str,
        typer.Option(
            "--server",
            envvar="DIAGNOSER_OPERATOR_SERVER",
            help="Base URL of the diagnoser service.",
            show_default=False,
        ),
    ],
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="DIAGNOSER_TOKEN",
            help="Bearer token, sent as 'Authorization: Bearer' on every request.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            envvar="DIAGNOSER_OPERATOR_DRY_RUN",
            help="Read the cluster, change nothing; complete each action done with dry_run=true.",
        ),
    ] = False,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            envvar="KUBECONFIG",
            help="Kubeconfig file (default: the pod's service account, else ~/.kube/config).",
            show_default=False,
        ),
    ] = None,
    kinds: Annotated[
        list[str] | None,
        typer.Option(
            "--kinds",
            envvar="DIAGNOSER_OPERATOR_KINDS",
            help=f"Action kinds to claim, comma-separated or repeated (default: {DEFAULT_KINDS}).",
            show_default=False,
        ),
    ] = None,
    operator_id: Annotated[
        str | None,
        typer.Option(
            "--operator-id",
            envvar="DIAGNOSER_OPERATOR_ID",
            help="Lease owner name (default: HOST-PID).",
            show_default=False,
        ),
    ] = None,
    verify_image: Annotated[
        str | None,
        typer.Option(
            "--verify-image",
            envvar="DIAGNOSER_VERIFY_IMAGE",
            help="Image of the verify_nodes all-gather test (with nccl-tests).",
            show_default=False,
        ),
    ] = None,
    verify_command: Annotated[
        str | None,
        typer.Option(
            "--verify-command",
            envvar="DIAGNOSER_VERIFY_COMMAND",
            help="Test container command, split like a shell (default: all_gather_perf ...).",
            show_default=False,
        ),
    ] = None,
    verify_namespace: Annotated[
        str,
        typer.Option(
            "--verify-namespace",
            envvar="DIAGNOSER_VERIFY_NAMESPACE",
            help="Namespace of the test Jobs when the action names none.",
        ),
    ] = "diagnoser",
    verify_gpus: Annotated[
        int,
        typer.Option(
            "--verify-gpus", envvar="DIAGNOSER_VERIFY_GPUS", min=0, help="GPUs per test pod."
        ),
    ] = 8,
    restart_workloads: Annotated[
        str,
        typer.Option(
            "--restart-workloads",
            envvar="DIAGNOSER_RESTART_WORKLOADS",
            help="Workload kinds restart_job may restart, comma-separated.",
        ),
    ] = "PyTorchJob,JobSet,Job,Pod",
    bare_pod_label: Annotated[
        str,
        typer.Option(
            "--bare-pod-label",
            envvar="DIAGNOSER_BARE_POD_LABEL",
            help="Label whose value is the job id, on pods of a job with no known workload.",
        ),
    ] = "diagnoser.io/job",
    pod_grace_seconds: Annotated[
        int | None,
        typer.Option(
            "--pod-grace-seconds",
            envvar="DIAGNOSER_POD_GRACE_SECONDS",
            min=0,
            help="Grace period of deleted pods (default: each pod's own).",
            show_default=False,
        ),
    ] = None,
    lease_seconds: Annotated[
        int,
        typer.Option("--lease-seconds", min=5, max=3600, help="Lease asked for on each claim."),
    ] = 120,
    log_level: Annotated[
        str, typer.Option("--log-level", envvar="DIAGNOSER_LOG_LEVEL", help="Logging level.")
    ] = "info",
) -> None:
    """Claim recovery actions from the service and carry them out on Kubernetes."""
    chosen = parse_kinds(kinds or [DEFAULT_KINDS])
    workloads = parse_workloads(restart_workloads)
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        raise _fail(f"unknown log level {log_level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from diagnoser.operator.cluster import connect
        from diagnoser.operator.executor import Executor
        from diagnoser.operator.loop import LoopSettings, Operator
        from diagnoser.operator.restart import RestartSettings
        from diagnoser.operator.verify import VerifySettings
    except ImportError as exc:
        raise _fail(f"{exc.name or 'kubernetes'} is missing: install diagnoser[operator]") from exc
    from kubernetes.config import ConfigException

    try:
        cluster = connect(kubeconfig)
    except (ConfigException, OSError) as exc:
        raise _fail(f"no usable Kubernetes configuration: {exc}") from exc

    verify = VerifySettings(namespace=verify_namespace, gpus_per_node=verify_gpus)
    if verify_image:
        verify = replace(verify, image=verify_image)
    if verify_command:
        verify = replace(verify, command=tuple(shlex.split(verify_command)))
    restart = RestartSettings(
        bare_pod_label=bare_pod_label,
        workload_kinds=workloads,
        grace_period_seconds=pod_grace_seconds,
    )
    executor = Executor(cluster=cluster, restart=restart, verify=verify, dry_run=dry_run)
    settings = LoopSettings(
        operator_id=operator_id or f"{socket.gethostname()}-{os.getpid()}",
        kinds=chosen,
        lease_seconds=lease_seconds,
    )

    async def serve() -> None:
        from diagnoser.operator.client import ActionClient

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with ActionClient(server, token=token) as client:
            await Operator(client, executor, settings).run(stop)

    logging.getLogger("diagnoser.operator").info(
        "operator %s claiming %s from %s%s",
        settings.operator_id,
        ",".join(chosen),
        server,
        " (dry run)" if dry_run else "",
    )
    asyncio.run(serve())
