"""`diagnoser eval --llm`: the LLM stage scored on a corpus, against a scripted LLM over HTTP."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.llm.scripted_llm import Reply, scripted_llm
from tests.servers import run_diagnoser

UNKNOWN = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 10, in <module>\n'
    "FluxCapacitorError: the flux capacitor drifted out of phase\n"
)
ANSWER: dict[str, Any] = {
    "failure_type": "flux_capacitor_drift",
    "category": "user_code",
    "fault": "user",
    "culprit_nodes": [],
    "action": "notify_user",
    "evidence": [1],
    "summary": "The script raised FluxCapacitorError.",
    "mitigation": "",
}


def corpus(root: Path) -> Path:
    for case_id, text, expected in (
        (
            "user-flux-1",
            UNKNOWN,
            "{status: failure, category: user_code, failure_type: FluxCapacitorError, "
            "action: notify_user, culprit_nodes: []}",
        ),
        (
            "benign-1",
            "iteration 1/10 | loss 2.0\niteration 2/10 | loss 1.9\n",
            "{status: healthy, category: null, failure_type: healthy, action: none, "
            "culprit_nodes: []}",
        ),
    ):
        case = root / "cases" / case_id
        case.mkdir(parents=True)
        (case / "node-0.log").write_text(text)
        (case / "case.yaml").write_text(
            f"id: {case_id}\nclass: {case_id.split('-')[0]}\nsplit: dev\nsource: synthetic\n"
            f"tags: []\nexpected: {expected}\nnote: test case\n"
        )
    (root / "floors.yaml").write_text("action: 0.0\n")
    return root


def llm_env(base_url: str) -> dict[str, str]:
    return {
        "DIAGNOSER_LLM__BASE_URL": base_url,
        "DIAGNOSER_LLM__MODEL": "scripted",
        "DIAGNOSER_LLM__MAX_RETRIES": "0",
    }


def test_eval_llm_reports_what_the_vote_decided_and_got_right(tmp_path: Path) -> None:
    root = corpus(tmp_path)
    with scripted_llm([Reply(ANSWER)]) as llm:
        result = run_diagnoser(
            "eval", str(root), "--llm", "--repeat", "2", "--json", env=llm_env(llm.base_url)
        )
        rules_only = run_diagnoser("eval", str(root), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    scored = json.loads(result.stdout)
    assert scored["llm"] == {"asked": [1, 1], "decided": [1, 1], "right": [1, 1], "unreachable": 0}
    assert scored["total"]["action_accuracy"]["mean"] == 1.0
    assert scored["total"]["action_accuracy"]["stdev"] == 0.0
    before = json.loads(rules_only.stdout)
    assert before["total"]["action_accuracy"]["mean"] == 0.5, "the rules alone escalate it"
    assert "llm" not in before
    assert len(llm.completions) == 8, "two runs, four agreeing samples each"


def test_eval_llm_without_an_endpoint_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_LLM__")}
    env["DIAGNOSER_LLM__BASE_URL"] = ""
    result = run_diagnoser("eval", str(corpus(tmp_path)), "--llm", env=env)
    assert result.returncode == 2
    assert "DIAGNOSER_LLM__BASE_URL" in result.stderr
