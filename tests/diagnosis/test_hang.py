"""Hang detection offline: the stall an observer reports, combined with what the log says.

The logs are the evaluation corpus's real excerpts; the live detector is tested over HTTP in
tests/api/test_hangs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from diagnoser.config import Settings
from diagnoser.diagnosis import hang
from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.flow import DiagnosisFlow
from diagnoser.diagnosis.hub import DiagnosisHub
from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.diagnosis.offline import diagnose, node_logs
from diagnoser.evaluation.corpus import Case, load_corpus
from diagnoser.ingest.framing import Framer
from diagnoser.pipeline import StreamKey
from diagnoser.rules import Action, Category, RuleRegistry, RuleSet, load_dir
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import ActionRow, DiagnosisRow, JobRow

ROOT = Path(__file__).resolve().parents[2]
CASES = load_corpus(ROOT / "evals")
HOUR = 3600.0


@pytest.fixture(scope="module")
def pack() -> RuleSet:
    return load_dir(ROOT / "rules")


def logs_of(case_id: str) -> list[Path]:
    return list(next(c for c in CASES if c.id == case_id).logs)


def test_the_offline_default_window_is_the_service_default() -> None:
    assert Settings().hang.timeout_s == hang.DEFAULT_TIMEOUT_S


def test_the_service_default_is_a_restart() -> None:
    assert Settings().hang.action == hang.DEFAULT_ACTION == Action.RESTART_JOB


def test_the_hang_action_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIAGNOSER_HANG__ACTION", "escalate")
    assert Settings().hang.action == "escalate"
    monkeypatch.setenv("DIAGNOSER_HANG__ACTION", "cordon_node_and_restart")
    with pytest.raises(ValidationError, match=r"hang\.action"):
        Settings()


def test_a_stalled_log_without_an_error_is_a_hang_restarted_by_default(pack: RuleSet) -> None:
    logs = node_logs(logs_of("hang-onebit-6"))
    verdict = diagnose(logs, pack, stalled_for=2 * HOUR).verdict
    assert (verdict.status, verdict.action, verdict.failure_type, verdict.category) == (
        Status.FAILURE,
        Action.RESTART_JOB,
        "hang",
        Category.FRAMEWORK,
    )
    assert verdict.culprit_nodes == ()
    assert "2 h 00 min after a checkpoint save" in verdict.summary
    assert "Restart from the last checkpoint" in verdict.summary
    assert verdict.evidence[0].text.endswith("optim_states.pt.")
    assert verdict.evidence[0].action is Action.RESTART_JOB


def test_the_conservative_setting_escalates_the_same_hang(pack: RuleSet) -> None:
    logs = node_logs(logs_of("hang-onebit-6"))
    verdict = diagnose(logs, pack, stalled_for=2 * HOUR, hang_action=Action.ESCALATE).verdict
    assert (verdict.status, verdict.action, verdict.failure_type) == (
        Status.INCONCLUSIVE,
        Action.ESCALATE,
        "hang",
    )
    assert "2 h 00 min after a checkpoint save" in verdict.summary
    assert "py-spy dump" in verdict.summary


def test_a_hang_action_outside_the_two_choices_is_refused() -> None:
    tails = [hang.NodeTail("node-0", (hang.TailLine("step 10", 1, 0),))]
    with pytest.raises(ValueError, match="restart_job or escalate"):
        hang.hang_verdict(HOUR, tails, action=Action.CORDON_NODE_AND_RESTART)


EXTENSION_ROOTS = [
    "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...",
    "Using /tmp/torch_extensions as PyTorch extensions root...",
]


@pytest.mark.parametrize("action", [Action.RESTART_JOB, Action.ESCALATE])
@pytest.mark.parametrize("root_line", EXTENSION_ROOTS)
def test_a_stall_on_the_extension_build_lock_needs_the_user(
    pack: RuleSet, tmp_path: Path, action: Action, root_line: str
) -> None:
    for node in ("node-0", "node-1"):
        (tmp_path / f"{node}.log").write_text(
            f"[INFO] Loading checkpoint shards: 100%|##########| 2/2\n{root_line}\n{root_line}\n",
            encoding="utf-8",
        )
    logs = node_logs(sorted(tmp_path.glob("*.log")))
    verdict = diagnose(logs, pack, stalled_for=HOUR, hang_action=action).verdict
    assert (verdict.status, verdict.action, verdict.failure_type) == (
        Status.FAILURE,
        Action.NOTIFY_USER,
        hang.EXTENSION_LOCK,
    )
    assert "PyTorch extensions root" in verdict.summary
    assert "lock" in verdict.summary
    assert verdict.evidence[0].text == root_line


def test_a_finished_extension_build_is_an_ordinary_hang(pack: RuleSet, tmp_path: Path) -> None:
    (tmp_path / "node-0.log").write_text(
        f"{EXTENSION_ROOTS[0]}\n"
        "Emitting ninja build file /root/.cache/torch_extensions/fused_adam/build.ninja...\n"
        "Building extension module fused_adam...\n"
        "Loading extension module fused_adam...\n"
        "Time to load fused_adam op: 0.21 seconds\n",
        encoding="utf-8",
    )
    verdict = diagnose(node_logs([tmp_path / "node-0.log"]), pack, stalled_for=HOUR).verdict
    assert (verdict.action, verdict.failure_type) == (Action.RESTART_JOB, "hang")


def test_no_stall_or_a_short_one_is_not_a_hang(pack: RuleSet) -> None:
    logs = node_logs(logs_of("hang-onebit-6"))
    assert diagnose(logs, pack).verdict.status is Status.HEALTHY
    assert diagnose(logs, pack, stalled_for=600).verdict.status is Status.HEALTHY
    assert diagnose(logs, pack, stalled_for=600, hang_timeout=300).verdict.failure_type == "hang"


def test_a_finished_run_is_not_a_hang(pack: RuleSet, tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text(
        "{'loss': 1.2, 'grad_norm': 0.8, 'learning_rate': 1e-05, 'epoch': 2.99}\n"
        "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
        "{'train_runtime': 5012.3, 'train_samples_per_second': 9.6, 'epoch': 3.0}\n",
        encoding="utf-8",
    )
    verdict = diagnose(node_logs([log]), pack, stalled_for=10 * HOUR).verdict
    assert verdict.status is Status.HEALTHY


FAILURES = [c for c in CASES if c.expected.status is not Status.HEALTHY and not c.stalled]


@pytest.mark.parametrize("case", FAILURES, ids=lambda c: c.id)
def test_an_error_in_the_log_outranks_the_stall(pack: RuleSet, case: Case) -> None:
    """On every real failure log of the corpus, a stall changes nothing the log explains."""
    logs = node_logs(list(case.logs))
    plain = diagnose(logs, pack).verdict
    stalled = diagnose(logs, pack, stalled_for=24 * HOUR).verdict
    if plain.status is Status.HEALTHY:
        assert stalled.failure_type in hang.HANG_TYPES
    else:
        assert (stalled.status, stalled.action, stalled.failure_type, stalled.culprit_nodes) == (
            plain.status,
            plain.action,
            plain.failure_type,
            plain.culprit_nodes,
        )


def test_the_window_grows_with_the_jobs_own_step_interval() -> None:
    assert hang.window(1800, []) == 1800
    assert hang.window(1800, [60, 600, 120]) == 1800
    assert hang.window(1800, [60, 2400]) == 7200


def test_nodes_silent_while_others_talk_are_named_only_when_few() -> None:
    line = (hang.TailLine("step 10", 1, 0),)
    tails = [hang.NodeTail(f"n{i}", line, last_at=1000.0) for i in range(7)]
    tails.append(hang.NodeTail("n7", line, last_at=0.0))
    assert hang.silent_nodes(tails, now=1000.0, window_s=600) == ("n7",)
    half = [hang.NodeTail(f"n{i}", line, last_at=0.0 if i % 2 else 1000.0) for i in range(8)]
    assert hang.silent_nodes(half, now=1000.0, window_s=600) == ()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def live_hang(action: Action | None, text: str) -> tuple[Action, str | None, str]:
    """The live stage's verdict for a running job that wrote `text` then stalled an hour."""
    clock = Clock()
    registry = RuleRegistry(ROOT / "rules")
    stage = (
        DiagnosisStage(registry, clock=clock)
        if action is None
        else DiagnosisStage(registry, clock=clock, hang_action=action)
    )
    stage.process(StreamKey("job", "node-0/stdout", "node-0", None), Framer().feed(text.encode()))
    stage.changed_verdict("job")
    stage.record_lifecycle("job", hang.LifecycleEvent("started", None, clock.now))
    stage.load_lifecycle("job", [])
    clock.now += HOUR
    (found,) = stage.stall_candidates(1800.0)
    result = stage.hang(*found)
    assert result is not None
    verdict = result[0]
    return verdict.action, verdict.failure_type, verdict.summary


STEPS = "".join(f"iteration {i}/50000 | lm loss: 2.41E+00\n" for i in range(1, 6))


def test_the_live_stage_restarts_a_hang_by_default_and_escalates_when_told() -> None:
    assert live_hang(None, STEPS)[:2] == (Action.RESTART_JOB, "hang")
    assert live_hang(Action.RESTART_JOB, STEPS)[:2] == (Action.RESTART_JOB, "hang")
    assert live_hang(Action.ESCALATE, STEPS)[:2] == (Action.ESCALATE, "hang")


@pytest.mark.parametrize("action", [None, Action.ESCALATE])
def test_the_live_stage_sends_a_stale_extension_lock_to_the_user(action: Action | None) -> None:
    text = STEPS + EXTENSION_ROOTS[0] + "\n"
    got, failure_type, summary = live_hang(action, text)
    assert (got, failure_type) == (Action.NOTIFY_USER, hang.EXTENSION_LOCK)
    assert "extensions root" in summary


async def test_a_resolved_hang_supersedes_its_unclaimed_restart(sqlite_url: str) -> None:
    """The default restart goes to the outbox; progress resuming before the operator claims it
    means the job runs again without it."""
    db = parse_database_url(sqlite_url)
    upgrade(db)
    engine = create_service_engine(db)
    sessions = Sessions(engine, db)
    clock = Clock()
    stage = DiagnosisStage(RuleRegistry(ROOT / "rules"), clock=clock)
    flow = DiagnosisFlow(sessions, stage, DiagnosisHub())
    key = StreamKey("job", "node-0/stdout", "node-0", None)
    try:
        async with sessions.begin() as session:
            session.add(JobRow(id="job"))
        stage.process(key, Framer().feed(STEPS.encode()))
        await flow.settle("job")
        stage.record_lifecycle("job", hang.LifecycleEvent("started", None, clock.now))
        clock.now += HOUR
        (diagnosis_id,) = await flow.report_stalls(1800.0)

        async def actions() -> list[tuple[str, str]]:
            async with sessions.begin() as session:
                rows = await session.scalars(
                    select(ActionRow).where(ActionRow.diagnosis_id == diagnosis_id)
                )
                return [(row.kind, row.state) for row in rows]

        assert await actions() == [("restart_job", "pending")]
        stage.process(key, Framer().feed(b"iteration 6/50000 | lm loss: 2.40E+00\n"))
        await flow.settle("job")
        assert await actions() == [("restart_job", "cancelled")]
        async with sessions.begin() as session:
            row = await session.get(DiagnosisRow, diagnosis_id)
            assert row is not None
            assert row.status == "resolved"
    finally:
        await sessions.close()
