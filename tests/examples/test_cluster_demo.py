"""The cluster demo end to end: real `diagnoser serve`, `diagnoser run` ranks, kmock emulator.

The first test runs on every build: ranks to diagnosis. The second needs the actions API and
`diagnoser operator` (issue 14) and is skipped, with the reason, while either is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples.cluster_demo import DemoConfig, Timeline, run_demo
from examples.cluster_demo.cluster import BYSTANDER_POD, JOB_LABEL
from examples.cluster_demo.timeline import TAINT_KEY

FAULTY = "node-2"
WORKERS = [f"train-demo-worker-{rank}" for rank in range(4)]


def assert_one_diagnosis_of_node_2(timeline: Timeline) -> dict[str, object]:
    assert len(timeline.diagnoses) == 1, timeline.diagnoses
    diagnosis = timeline.diagnoses[0]
    assert diagnosis["culprit_nodes"] == [FAULTY]
    assert diagnosis["category"] == "hardware"
    assert diagnosis["failure_type"] == "gpu_fallen_off_bus"
    assert diagnosis["action"] == "cordon_node_and_restart"
    # The other ranks' NCCL timeouts joined the same incident as symptoms.
    assert {"xid_fallen_off_bus", "nccl_watchdog_timeout"} <= set(diagnosis["rule_ids"])
    return diagnosis


def attempt_of(pod: dict[str, Any]) -> str | None:
    """The stand-in controller's count: 0 for the original pod, 1 after one recreation."""
    attempt: str | None = pod["metadata"].get("annotations", {}).get("demo.diagnoser.io/attempt")
    return attempt


@pytest.mark.timeout(420)
async def test_the_ranks_fail_and_the_service_blames_node_2(tmp_path: Path) -> None:
    config = DemoConfig(operator=False, work_dir=tmp_path)

    timeline = await run_demo(config)

    assert timeline.finished, timeline.notes
    assert_one_diagnosis_of_node_2(timeline)
    assert timeline.exit_codes == {"node-0": 134, "node-1": 134, "node-2": 1, "node-3": 134}
    steps = [step.what for step in timeline.steps]
    xid = next(i for i, what in enumerate(steps) if "79, GPU has fallen off the bus" in what)
    diagnosed = next(i for i, what in enumerate(steps) if "cordon_node_and_restart" in what)
    assert xid < diagnosed
    assert sum("NCCL watchdog" in what for what in steps) == 3
    assert any("iteration 1:" in what for what in steps)
    # Nobody acted: every Node is schedulable and every worker still runs its first attempt.
    assert timeline.cordoned_nodes == []
    attempts = {pod["metadata"]["name"]: attempt_of(pod) for pod in timeline.pods}
    assert attempts == {**dict.fromkeys(WORKERS, "0"), BYSTANDER_POD: None}
    # Each rank's output is on disk too (diagnoser run's local copy).
    assert "GPU has fallen off the bus" in (tmp_path / "node-2.log").read_text()


@pytest.mark.timeout(420)
async def test_the_operator_cordons_node_2_and_restarts_the_job(tmp_path: Path) -> None:
    timeline = await run_demo(DemoConfig(work_dir=tmp_path))

    assert timeline.finished, timeline.notes
    diagnosis = assert_one_diagnosis_of_node_2(timeline)

    assert timeline.cordoned_nodes == [FAULTY]
    node = timeline.node(FAULTY)
    assert node is not None
    assert node["spec"]["unschedulable"] is True
    taints = [t for t in node["spec"]["taints"] if t["key"] == TAINT_KEY]
    assert [t["effect"] for t in taints] == ["NoSchedule"]
    assert node["metadata"]["labels"]["diagnoser.io/cordoned"] == "true"
    assert node["metadata"]["annotations"]["diagnoser.io/diagnosis-id"] == diagnosis["id"]
    for other in timeline.nodes:
        if other["metadata"]["name"] != FAULTY:
            assert not other["spec"].get("unschedulable"), other
            assert not other["spec"].get("taints"), other

    # The job restarted: every worker was deleted and created again, none on node-2.
    workers = [p for p in timeline.pods if p["metadata"]["labels"].get(JOB_LABEL) == "train-demo"]
    assert sorted(p["metadata"]["name"] for p in workers) == WORKERS
    for pod in workers:
        assert int(attempt_of(pod) or 0) >= 1, pod
        assert pod["spec"].get("nodeName") != FAULTY
    bystander = next(p for p in timeline.pods if p["metadata"]["name"] == BYSTANDER_POD)
    assert bystander["status"]["phase"] == "Running"

    kinds = {action["kind"]: action for action in timeline.actions}
    cordon, restart = kinds["cordon_node"], kinds["restart_job"]
    assert cordon["target"]["node"] == FAULTY
    assert cordon["diagnosis_id"] == restart["diagnosis_id"] == diagnosis["id"]
    assert cordon["state"] == restart["state"] == "done"
    assert cordon["id"] in restart["depends_on"]
    assert not [a for a in timeline.actions if a["kind"] == "cordon_node" and a is not cordon]
