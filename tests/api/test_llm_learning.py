"""Retrieval and learned rules in the running service: a real `diagnoser serve`, a scripted LLM."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import regex
import yaml

from tests.api.llm_service import StartService, diagnose, diagnosis, llm_services, wait_for_llm
from tests.llm.scripted_llm import Reply, scripted_llm
from tests.servers import ServiceProcess

PACK = Path(__file__).resolve().parents[2] / "rules"
UNKNOWN_FAILURE = (
    "[rank0]: iteration 100/1000 | lm loss 2.3\n"
    "Traceback (most recent call last):\n"
    '  File "train.py", line 10, in <module>\n'
    "    step()\n"
    "FluxCapacitorError: the flux capacitor drifted out of phase\n"
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.2 GiB is free.\n"
)
NUMBERED = regex.compile(r"^\[(\d+)\] node=\S+.*\| (.*)$", regex.MULTILINE)


def cite_the_failure(body: dict[str, Any]) -> Reply:
    """Answer as a model that read the trace: cite the exception line, wherever it is numbered."""
    prompt = body["messages"][1]["content"]
    trace = prompt.rsplit("<log>", 1)[1]
    line = next(int(n) for n, text in NUMBERED.findall(trace) if "FluxCapacitorError" in text)
    return Reply(
        {
            "failure_type": "flux_capacitor_drift",
            "category": "user_code",
            "fault": "user",
            "culprit_nodes": [],
            "action": "notify_user",
            "evidence": [line],
            "summary": "The training script raised FluxCapacitorError.",
            "mitigation": "Fix the capacitor.",
        }
    )


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(PACK, target)
    return target


@pytest.fixture
def service_for(tmp_path: Path, rules_dir: Path) -> Iterator[StartService]:
    with llm_services(tmp_path / "data") as start:
        yield partial(start, DIAGNOSER_RULES_DIR=str(rules_dir), DIAGNOSER_LLM__SUGGEST_AFTER="3")


def suggestions(service: ServiceProcess) -> dict[str, Any]:
    response = httpx.get(f"{service.base_url}/v1/rules/suggestions", timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_failure_the_llm_keeps_resolving_becomes_a_rule_once_a_person_accepts_it(
    service_for: StartService, rules_dir: Path
) -> None:
    with scripted_llm([cite_the_failure]) as llm:
        service = service_for(llm)
        for job in ("learn-1", "learn-2"):
            decided = wait_for_llm(service, diagnose(service, job, "gpu-1", UNKNOWN_FAILURE))
            assert decided["source"] == "llm"
        assert suggestions(service)["suggestions"] == [], "two jobs are not yet three"
        third = UNKNOWN_FAILURE.replace("100/1000", "7/9")
        assert wait_for_llm(service, diagnose(service, "learn-3", "gpu-1", third))["source"] == (
            "llm"
        )
        calls = len(llm.completions)

        offered = suggestions(service)["suggestions"]
        assert len(offered) == 1, suggestions(service)
        suggestion = offered[0]
        before = httpx.get(f"{service.base_url}/v1/rules", timeout=5).json()["digest"]
        accepted = httpx.post(
            f"{service.base_url}/v1/rules/suggestions/{suggestion['id']}/accept", timeout=30
        )
        again = httpx.post(
            f"{service.base_url}/v1/rules/suggestions/{suggestion['id']}/accept", timeout=30
        )
        pack = httpx.get(f"{service.base_url}/v1/rules", timeout=5).json()
        unknown = httpx.post(f"{service.base_url}/v1/rules/suggestions/0123456789ab/accept")
        malformed = httpx.post(f"{service.base_url}/v1/rules/suggestions/..%2F..%2Fx/accept")
        after_accept = suggestions(service)

        fourth = diagnosis(service, diagnose(service, "learn-4", "gpu-7", third))

    assert calls == 4, "the same trace on three jobs: one round of votes, two cache hits"
    assert suggestion["jobs"] == 3
    assert suggestion["category"] == "user_code"
    assert suggestion["action"] == "notify_user"
    assert suggestion["failure_type"] == "{exception}", "the LLM's own name is not in the taxonomy"
    assert "FluxCapacitorError" in suggestion["pattern"]
    assert suggestion["examples_match"] == [
        "FluxCapacitorError: the flux capacitor drifted out of phase"
    ]

    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["file"] == "learned.yaml"
    learned = yaml.safe_load((rules_dir / "learned.yaml").read_text())
    assert [rule["id"] for rule in learned["rules"]] == [suggestion["rule_id"]]
    assert again.status_code == 409
    assert unknown.status_code == 404
    assert malformed.status_code in (404, 422)
    assert pack["digest"] != before
    assert suggestion["rule_id"] in {rule["id"] for rule in pack["rules"]}
    assert after_accept["suggestions"] == []

    assert fourth["source"] == "rule"
    assert fourth["rule_ids"] == [suggestion["rule_id"]]
    assert fourth["failure_type"] == "FluxCapacitorError"
    assert fourth["action"] == "notify_user"
    assert fourth["llm"] is None
    assert len(llm.completions) == calls, "the learned rule decided it: no LLM call"


def test_a_person_confirmed_diagnosis_is_shown_to_the_llm_next_time(
    service_for: StartService,
) -> None:
    with scripted_llm([cite_the_failure]) as llm:
        service = service_for(llm)
        first = wait_for_llm(service, diagnose(service, "seen-1", "gpu-1", UNKNOWN_FAILURE))
        confirmed = httpx.post(
            f"{service.base_url}/v1/diagnoses/{first['id']}/feedback",
            json={"kind": "confirm", "author": "oncall"},
            timeout=5,
        )
        oom = diagnosis(service, diagnose(service, "other-1", "gpu-2", CUDA_OOM))
        calls = len(llm.completions)
        later = wait_for_llm(service, diagnose(service, "seen-2", "gpu-1", UNKNOWN_FAILURE))
        prompts = [c["messages"][1]["content"] for c in llm.completions[calls:]]

    assert confirmed.status_code == 201, confirmed.text
    assert oom["source"] == "rule", "a rule decided this one: a candidate, but not a similar one"
    assert prompts, "the confirmed example made it a new question: asked, not taken from the cache"
    examples = prompts[0].split("Past diagnoses of other jobs", 1)[1].split("</log>", 1)[0]
    assert "confirmed by a person: category user_code, action notify_user" in examples
    assert "FluxCapacitorError: the flux capacitor drifted out of phase" in examples
    assert "OutOfMemoryError" not in examples
    assert later["source"] == "llm"
