"""Hang detection offline: the stall an observer reports, combined with what the log says.

The logs are the evaluation corpus's real excerpts; the live detector is tested over HTTP in
tests/api/test_hangs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.config import Settings
from diagnoser.diagnosis import hang
from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.offline import diagnose, node_logs
from diagnoser.evaluation.corpus import Case, load_corpus
from diagnoser.rules import Action, RuleSet, load_dir

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


def test_a_stalled_log_without_an_error_is_a_hang_escalation(pack: RuleSet) -> None:
    logs = node_logs(logs_of("hang-onebit-6"))
    verdict = diagnose(logs, pack, stalled_for=2 * HOUR).verdict
    assert (verdict.status, verdict.action, verdict.failure_type) == (
        Status.INCONCLUSIVE,
        Action.ESCALATE,
        "hang",
    )
    assert verdict.culprit_nodes == ()
    assert "2 h 00 min after a checkpoint save" in verdict.summary
    assert verdict.evidence[0].text.endswith("optim_states.pt.")


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
        assert stalled.failure_type == "hang"
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
