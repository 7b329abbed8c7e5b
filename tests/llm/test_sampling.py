"""The real openai client against a scripted OpenAI-compatible server: votes, fallbacks."""

from __future__ import annotations

from typing import Any

import pytest

from diagnoser.config import LlmSettings
from diagnoser.llm.answer import TraceLines
from diagnoser.llm.breaker import BreakerState, CircuitBreaker
from diagnoser.llm.client import LlmClient, LlmUnavailableError, OutputMode, extract_json
from diagnoser.llm.sampling import ask
from diagnoser.rules.schema import Action
from tests.llm.scripted_llm import Fail, Reply, Step, scripted_llm

TRACE = TraceLines(
    node_of_line={1: "gpu-1", 2: "gpu-2", 3: "gpu-3"},
    job_nodes=frozenset({"gpu-1", "gpu-2", "gpu-3"}),
)
MESSAGES = [{"role": "system", "content": "diagnose"}, {"role": "user", "content": "<log>x</log>"}]

CORDON: dict[str, Any] = {
    "failure_type": "gpu_fallen_off_bus",
    "category": "hardware",
    "fault": "infrastructure",
    "culprit_nodes": ["gpu-3"],
    "action": "cordon_node_and_restart",
    "evidence": [3],
    "summary": "Xid 79 on gpu-3.",
    "mitigation": "cordon gpu-3",
}
RESTART: dict[str, Any] = {
    **CORDON,
    "failure_type": "nccl_timeout",
    "category": "network",
    "culprit_nodes": [],
    "action": "restart_job",
    "evidence": [1, 2],
}


def client_for(
    base_url: str, timeout_s: float = 5.0, breaker: CircuitBreaker | None = None
) -> LlmClient:
    return LlmClient(
        LlmSettings(base_url=base_url, model="scripted", timeout_s=timeout_s, max_retries=0),
        breaker=breaker,
    )


async def test_unanimous_answers_stop_after_the_needed_four() -> None:
    with scripted_llm([Reply(CORDON)]) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert asked.verdict.decided
    assert asked.verdict.action is Action.CORDON_NODE_AND_RESTART
    assert asked.verdict.culprit_nodes == ("gpu-3",)
    assert asked.calls == 4
    seeds = sorted(r["seed"] for r in llm.completions)
    assert seeds == [0, 1, 2, 3]
    assert all(r["response_format"]["type"] == "json_schema" for r in llm.completions)


async def test_without_early_stop_all_k_are_asked() -> None:
    with scripted_llm([Reply(CORDON)]) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8, early_stop=False)
        await client.aclose()
    assert asked.calls == 5
    assert asked.verdict.confidence == 1.0


async def test_three_to_two_stays_inconclusive() -> None:
    script = [Reply(CORDON), Reply(RESTART), Reply(CORDON), Reply(RESTART), Reply(CORDON)]
    with scripted_llm(script) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8, early_stop=False)
        await client.aclose()
    assert not asked.verdict.decided
    assert asked.verdict.action is Action.ESCALATE
    assert asked.verdict.votes == {
        "hardware/cordon_node_and_restart": 3,
        "network/restart_job": 2,
    }


async def test_an_answer_naming_a_node_outside_the_job_is_no_vote() -> None:
    foreign = {**CORDON, "culprit_nodes": ["gpu-99"]}
    with scripted_llm([Reply(foreign)]) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert not asked.verdict.decided
    assert asked.verdict.votes == {"abstain": asked.calls}
    assert asked.calls == 4, "after a first round of four abstentions no winner can reach 4 of 5"


async def test_invalid_json_is_asked_again_once_then_abstains() -> None:
    with scripted_llm([Reply("I think it is the GPU."), Reply(CORDON)]) as llm:
        client = client_for(llm.base_url)
        completion = await client.complete_json(MESSAGES, {}, seed=7, temperature=0.7)
        await client.aclose()
    assert completion.payload == CORDON
    assert len(llm.completions) == 2

    with scripted_llm([Reply("not json at all")]) as llm:
        client = client_for(llm.base_url)
        completion = await client.complete_json(MESSAGES, {}, seed=7, temperature=0.7)
        await client.aclose()
    assert completion.payload is None
    assert completion.error == "no JSON object in the answer"
    assert len(llm.completions) == 2


async def test_a_server_without_json_schema_gets_json_object() -> None:
    with scripted_llm([Reply(CORDON)], rejects_json_schema=True) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert asked.verdict.decided
    assert asked.mode == "json_object"
    kinds = [(r.get("response_format") or {}).get("type") for r in llm.completions]
    assert kinds.count("json_schema") >= 1
    assert kinds[-1] == "json_object"


async def test_a_fenced_answer_with_chatter_is_parsed() -> None:
    fenced = "Sure! Here is the diagnosis:\n```json\n" + __import__("json").dumps(CORDON) + "\n```"
    with scripted_llm([Reply(fenced)]) as llm:
        client = client_for(llm.base_url)
        completion = await client.complete_json(MESSAGES, {}, seed=1, temperature=0.7)
        await client.aclose()
    assert completion.payload == CORDON


def test_extract_json_takes_the_first_object_and_survives_garbage() -> None:
    assert extract_json('x {"a": 1} {"b": 2}') == {"a": 1}
    assert extract_json('[1, 2] {broken {"ok": true}') == {"ok": True}
    assert extract_json("{" * 100_000) is None
    assert extract_json("") is None


async def test_a_500_steps_down_then_fails_as_a_transport_error() -> None:
    with scripted_llm([Fail(500)]) as llm:
        client = client_for(llm.base_url)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert not asked.verdict.decided
    assert asked.mode == OutputMode.TEXT.label
    assert all(s.__class__.__name__ == "Abstention" for s in asked.samples)


async def test_a_timeout_is_an_abstention_not_a_hang() -> None:
    with scripted_llm([Reply(CORDON, delay_s=3.0)]) as llm:
        client = client_for(llm.base_url, timeout_s=0.5)
        asked = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert not asked.verdict.decided
    assert asked.samples
    assert all(getattr(s, "reason", "") == "APITimeoutError" for s in asked.samples)


async def test_the_breaker_opens_after_failures_and_closes_after_a_good_trial() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=10, clock=lambda: now[0])
    script: list[Step] = [Fail(503), Fail(503), Reply(CORDON)]
    with scripted_llm(script) as llm:
        client = client_for(llm.base_url, breaker=breaker)
        for _ in range(2):
            failed = await client.complete_json(MESSAGES, {}, seed=1, temperature=0.7)
            assert failed.transport_failed
        assert breaker.state == BreakerState.OPEN
        with pytest.raises(LlmUnavailableError):
            await client.complete_json(MESSAGES, {}, seed=1, temperature=0.7)
        assert len(llm.completions) == 2, "an open breaker makes no call"
        now[0] = 11.0
        assert str(breaker.state) == "half_open"
        recovered = await client.complete_json(MESSAGES, {}, seed=1, temperature=0.7)
        await client.aclose()
    assert recovered.payload == CORDON
    assert str(breaker.state) == "closed"


async def test_an_open_breaker_ends_asking_inconclusive_without_calls() -> None:
    breaker = CircuitBreaker(failure_threshold=1, reset_after_s=60)
    with scripted_llm([Fail(503)]) as llm:
        client = client_for(llm.base_url, breaker=breaker)
        first = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        calls_after_first = len(llm.completions)
        second = await ask(client, MESSAGES, TRACE, k=5, min_agreement=0.8)
        await client.aclose()
    assert not first.verdict.decided
    assert not second.verdict.decided
    assert second.calls == 0
    assert len(llm.completions) == calls_after_first


def test_the_breaker_counts_each_trip_once_and_a_failed_trial_as_another() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=10, clock=lambda: now[0])
    breaker.record_failure()
    assert breaker.trips == 0
    breaker.record_failure()
    breaker.record_failure()  # a concurrent call that was already out fails too
    assert (breaker.state, breaker.trips) == (BreakerState.OPEN, 1)
    now[0] = 11.0
    assert breaker.allow()  # the half-open trial
    breaker.record_failure()
    assert (breaker.state, breaker.trips) == (BreakerState.OPEN, 2)
    now[0] = 22.0
    assert breaker.allow()
    breaker.record_success()
    assert (breaker.state, breaker.trips) == (BreakerState.CLOSED, 2)
