"""The Log Agent in the service: a real `diagnoser serve` asks a scripted LLM over real HTTP.

Lines the deterministic proposer cannot filter (a bracketed thread name with spaces is one
`<*>` word to the miner, which `[^ \\t\\n]+` does not take) go in; the agent, off the ingest
path, asks k times, validates and votes; its filter is stored with proposer `llm` and drops
the template's later lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.api.llm_service import llm_services
from tests.llm.scripted_llm import Reply, scripted_llm
from tests.servers import ServiceProcess, post_text, wait_until

THREADS = ["[main thread]", "[io worker pool]", "[prefetch]", "[data loader 3]"]
SHARD = r"^\[[a-z0-9 ]+\] loaded shard ([0-9]+) of ([0-9]+) in ([0-9]+) ms$"
ANSWER = Reply({"regex": SHARD, "slots": [{"name": "step", "group": 1}]})
FAILURE = "[main thread] loaded shard 7 of 512 failed: checksum mismatch"


def shard_lines(start: int, end: int) -> str:
    lines = [f"{THREADS[i % 4]} loaded shard {i} of 512 in {i * 3} ms" for i in range(start, end)]
    return "\n".join(lines) + "\n"


def filters(service: ServiceProcess) -> list[dict[str, Any]]:
    response = httpx.get(f"{service.base_url}/v1/filters", params={"family": "shards"})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["filters"]
    return found


def kept(service: ServiceProcess, job: str) -> int:
    body = httpx.get(f"{service.base_url}/v1/jobs/{job}").json()
    return int(body["compression"]["lines_kept"])


def test_the_log_agent_proposes_a_filter_that_is_stored_and_used(tmp_path: Path) -> None:
    with scripted_llm([ANSWER]) as llm, llm_services(tmp_path / "data") as start:
        service = start(llm, DIAGNOSER_LLM__SAMPLES="3", DIAGNOSER_LLM__LOG_AGENT_INTERVAL_S="0.2")
        post_text(service, "shards-run1", "node-1", FAILURE + "\n" + shard_lines(0, 40))
        assert kept(service, "shards-run1") == 41, "no deterministic filter for these lines"
        wait_until(lambda: any(f["proposer"] == "llm" for f in filters(service)), 30, "llm filter")

        (stored,) = filters(service)
        assert stored["pattern"] == SHARD.replace("(", "(?:")
        assert stored["names"] == ["step", "other", "other"]
        assert stored["scope"] == "family"
        assert len(llm.completions) == 3, "k samples, asked once"
        prompt = llm.completions[0]["messages"][1]["content"]
        assert "loaded shard" in prompt

        post_text(service, "shards-run1", "node-1", shard_lines(40, 100) + FAILURE + "\n")
        assert kept(service, "shards-run1") == 42, "the llm filter drops them; the failure stays"
