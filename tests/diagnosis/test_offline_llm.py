"""`diagnoser diagnose` with an LLM configured: a child process against a scripted LLM over HTTP
(exact cases) and a real local model (mechanics)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.api.test_llm_stage import INJECTION, UNKNOWN_FAILURE, answer
from tests.llm.local_model import local_model
from tests.llm.scripted_llm import Fail, Reply, ScriptedLlm, scripted_llm
from tests.servers import free_port, run_diagnoser

HEALTHY_LINE = "[rank8]: iteration 100/1000 | lm loss 2.3\n"
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def llm_env(base_url: str, **extra: str) -> dict[str, str]:
    return {
        "DIAGNOSER_LLM__BASE_URL": base_url,
        "DIAGNOSER_LLM__MODEL": "scripted",
        "DIAGNOSER_LLM__TIMEOUT_S": "5",
        "DIAGNOSER_LLM__MAX_RETRIES": "0",
        **extra,
    }


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def diagnose(
    llm: ScriptedLlm | str, *args: str | Path, **extra: str
) -> subprocess.CompletedProcess[str]:
    base_url = llm if isinstance(llm, str) else llm.base_url
    return run_diagnoser(
        "diagnose", *(str(a) for a in args), env={"COLUMNS": "200", **llm_env(base_url, **extra)}
    )


def as_json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    return body


def test_a_unanimous_vote_decides_an_unexplained_failure(tmp_path: Path) -> None:
    log = write(tmp_path, "gpu-1.log", UNKNOWN_FAILURE)
    with scripted_llm([Reply(answer())]) as llm:
        body = as_json(diagnose(llm, log, "--json", DIAGNOSER_LLM__MAX_TOKENS="96"))
        text = diagnose(llm, log)
    assert {r["max_tokens"] for r in llm.completions[:4]} == {96}, "each answer is capped"
    assert body["source"] == "llm"
    assert body["action"] == "notify_user"
    assert body["category"] == "user_code"
    assert body["status"] == "failure"
    assert body["summary"].startswith("LLM (4 of 5 samples agree)")
    assert body["confidence"] == 0.8
    assert body["rule_ids"] == ["python_unclassified_exception"], "the rules' evidence stays"
    votes = body["votes"]
    assert votes["decided"] is True
    assert votes["votes"] == {"user_code/notify_user": 4}
    assert (votes["k"], votes["asked"]) == (5, 4)
    assert votes["abstentions"] == []
    assert (votes["model"], votes["prompt_version"]) == ("scripted", "diagnose.v1")
    assert (votes["tokens_in"], votes["tokens_out"]) == (400, 80)
    prompt = llm.completions[0]["messages"][1]["content"]
    assert "FluxCapacitorError" in prompt
    assert "iteration 100/1000" in prompt, "the file's last lines are part of the trace"
    assert text.returncode == 0, text.stderr
    assert "source llm" in text.stdout
    assert "LLM vote: decided with 0.80 of the votes (k 5, asked 4)" in text.stdout
    assert "votes: user_code/notify_user 4" in text.stdout
    assert "tokens 400 in / 80 out" in text.stdout


def test_a_split_vote_stays_with_a_human_and_shows_the_votes(tmp_path: Path) -> None:
    log = write(tmp_path, "gpu-1.log", UNKNOWN_FAILURE)
    other = answer(category="framework", action="restart_job", failure_type="flaky")
    script = [Reply(answer())] * 3 + [Reply(other)] * 2
    with scripted_llm(script) as llm:
        body = as_json(diagnose(llm, log, "--json"))
    with scripted_llm(script) as llm:
        text = diagnose(llm, log)
    assert body["action"] == "escalate"
    assert body["status"] == "inconclusive"
    assert body["source"] == "rule"
    assert body["summary"] == "FluxCapacitorError on gpu-1: escalate"
    assert body["votes"]["decided"] is False
    assert body["votes"]["votes"] == {"user_code/notify_user": 3, "framework/restart_job": 2}
    assert (body["votes"]["k"], body["votes"]["asked"]) == (5, 5)
    assert text.returncode == 0, text.stderr
    assert "LLM vote: not decided" in text.stdout
    assert "0.80 needed" in text.stdout
    assert "votes: user_code/notify_user 3, framework/restart_job 2" in text.stdout


def test_an_llm_that_is_down_leaves_escalate_with_a_note(tmp_path: Path) -> None:
    log = write(tmp_path, "gpu-1.log", UNKNOWN_FAILURE)
    with scripted_llm([Fail(503)]) as llm:
        failing = diagnose(llm, log, "--json")
    unreachable = diagnose(f"http://127.0.0.1:{free_port()}/v1", log, "--json")
    for done in (failing, unreachable):
        body = as_json(done)
        assert body["action"] == "escalate"
        assert body["source"] == "rule"
        assert body["votes"] is None
        [note] = done.stderr.strip().splitlines()
        assert note.startswith("note: the LLM could not be asked")
    assert "HTTP 503" in failing.stderr
    assert "APIConnectionError" in unreachable.stderr


def test_a_log_line_cannot_talk_the_llm_into_a_cordon(tmp_path: Path) -> None:
    fooled = answer(
        category="hardware",
        action="cordon_node_and_restart",
        culprit_nodes=["gpu-2"],
        evidence=[1],
    )
    logs = [write(tmp_path, "gpu-1.log", INJECTION), write(tmp_path, "gpu-2.log", HEALTHY_LINE)]
    with scripted_llm([Reply(fooled)]) as llm:
        body = as_json(diagnose(llm, *logs, "--json"))
    assert body["action"] == "escalate"
    assert body["source"] != "llm"
    assert "gpu-2" not in body["culprit_nodes"]
    assert body["votes"]["decided"] is False
    assert any("gpu-2" in reason for reason in body["votes"]["abstentions"])
    prompt = llm.completions[0]["messages"][1]["content"]
    assert prompt.count("</log>") == 1


def test_secrets_are_redacted_before_the_trace_leaves(tmp_path: Path) -> None:
    log = write(tmp_path, "gpu-1.log", f"{UNKNOWN_FAILURE}export HF_TOKEN={SECRET}\n")
    with scripted_llm([Reply(answer())]) as llm:
        as_json(diagnose(llm, log, "--json"))
    sent = json.dumps(llm.completions)
    assert SECRET not in sent
    assert "[REDACTED:" in sent


def test_rules_only_when_asked_or_when_the_rules_decide(tmp_path: Path) -> None:
    unknown = write(tmp_path, "gpu-1.log", UNKNOWN_FAILURE)
    oom = write(
        tmp_path,
        "gpu-2.log",
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
    )
    with scripted_llm([Reply(answer())]) as llm:
        forced = as_json(diagnose(llm, unknown, "--json", "--no-llm"))
        decided = as_json(diagnose(llm, oom, "--json"))
    assert forced["action"] == "escalate"
    assert forced["votes"] is None
    assert decided["source"] != "llm"
    assert decided["votes"] is None
    assert llm.completions == [], "nothing unresolved was sent"


def cite_failure_line(body: dict[str, Any]) -> Reply:
    """A hardware answer that cites the numbered line of gpu-1's own failure, as the prompt
    shows it."""
    prompt = body["messages"][1]["content"]
    found = re.search(r"^\[(\d+)\] node=gpu-1\b[^|]*\| FluxCapacitorError", prompt, re.MULTILINE)
    assert found is not None, prompt
    return Reply(
        answer(
            category="hardware",
            action="cordon_node_and_restart",
            failure_type="flux_capacitor_fault",
            culprit_nodes=["gpu-1"],
            evidence=[int(found[1])],
        )
    )


def test_a_decided_cordon_names_the_node_its_own_lines_show(tmp_path: Path) -> None:
    logs = [
        write(tmp_path, "gpu-1.log", UNKNOWN_FAILURE),
        write(tmp_path, "gpu-2.log", HEALTHY_LINE),
    ]
    with scripted_llm([cite_failure_line]) as llm:
        body = as_json(diagnose(llm, *logs, "--json"))
    assert body["action"] == "cordon_node_and_restart"
    assert body["culprit_nodes"] == ["gpu-1"]
    assert body["source"] == "llm"
    assert body["votes"]["evidence"][0]["node"] == "gpu-1"
    assert body["culprit_reason"].startswith("gpu-1: 4 of 5 LLM samples name it, citing")
    assert "FluxCapacitorError" in body["culprit_reason"]


def test_a_real_model_votes_offline_and_every_vote_is_checked(tmp_path: Path) -> None:
    """SmolLM2-135M over llama.cpp's server: the mechanics end to end, never its skill."""
    logs = [write(tmp_path, "gpu-1.log", INJECTION), write(tmp_path, "gpu-2.log", HEALTHY_LINE)]
    with local_model() as url:
        body = as_json(
            diagnose(
                url,
                *logs,
                "--json",
                DIAGNOSER_LLM__MODEL="smollm2",
                DIAGNOSER_LLM__SAMPLES="2",  # each sample is seconds of CPU on the suite's cores
                DIAGNOSER_LLM__MAX_TOKENS="160",  # room for an answer; a rambling one stops early
                DIAGNOSER_LLM__MIN_AGREEMENT="0.67",
                DIAGNOSER_LLM__TIMEOUT_S="120",
            )
        )
    votes = body["votes"]
    assert votes["k"] == 2
    assert 1 <= votes["asked"] <= 2, "asked until decided or undecidable"
    assert sum(votes["votes"].values()) == votes["asked"]
    assert votes["output_mode"] == "json_schema"
    assert votes["tokens_in"] > 0
    assert votes["tokens_out"] > 0
    assert "gpu-2" not in body["culprit_nodes"], "gpu-2's only line is healthy"
    if body["source"] != "llm":
        assert body["action"] == "escalate"
