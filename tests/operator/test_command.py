"""`diagnoser operator` as a process: kubeconfig to kmock, the scripted service, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from kubernetes.client import V1Node

from diagnoser.operator.cluster import Cluster
from diagnoser.operator.wire import ActionKind
from tests.operator.actionserver import ScriptedActions, serving
from tests.operator.conftest import Emulator, action, model
from tests.operator.test_cordon import CORDON
from tests.operator.test_loop import until


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{server.rstrip('/')}'}}}}]\n"
        "users: [{name: tester, user: {}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: tester}}]\n"
        "current-context: kmock\n"
    )
    return path


async def test_operator_process_cordons_and_stops_on_sigterm(
    cluster: Cluster, emulator: Emulator, tmp_path: Path
) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-3", "labels": {}}}
    cluster.core.create_node(model(V1Node, body))
    script = ScriptedActions()
    script.add(action(1, ActionKind.CORDON_NODE, CORDON))
    config = kubeconfig(tmp_path / "kubeconfig", emulator.url)
    async with serving(script) as url:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "diagnoser",
            "operator",
            "--server",
            url,
            "--kubeconfig",
            str(config),
            "--operator-id",
            "op-cli",
            "--kinds",
            "cordon_node",
            env={**os.environ, "DIAGNOSER_TOKEN": "from-env"},
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await until(lambda: script.state(1) == "done")
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, stderr.decode()
    assert emulator.raw("v1/nodes", None, "node-3")["spec"]["unschedulable"] is True
    assert script.actions[1]["lease_owner"] == "op-cli"
    assert set(script.authorizations) == {"Bearer from-env"}
    assert b"action 1 done: cordoned node node-3" in stderr
