"""Job and stream ids with hostile characters: never a 5xx, and never a way for a token bound
to node-a to write a stream that is not node-a's."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnoser.auth.binding import Binding
from tests.auth.issuing import Token, create_token
from tests.servers import ServiceProcess

HOSTILE = st.text(
    alphabet="node-a/b.._:@*?[]%\\\x00\n\r\t '\"<>{}$;|&\u00e9\u202e",
    min_size=0,
    max_size=40,
) | st.sampled_from(["node-a/../node-b", "node-a\x00node-b", "../node-b", "node-a/", "node-ab"])


@given(stream=HOSTILE)
def test_a_bound_node_owns_exactly_its_own_stream_names(stream: str) -> None:
    own = stream == "node-a" or stream.startswith("node-a/")
    assert (Binding(node="node-a").stream_problem(stream) is None) is own


@given(job=HOSTILE)
def test_a_job_pattern_matches_only_what_it_says(job: str) -> None:
    problem = Binding(jobs="train-*").job_problem(job)
    assert (problem is None) is job.startswith("train-")


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Token]]:
    data_dir = tmp_path_factory.mktemp("hostile")
    token = create_token(data_dir, "ingest", "--node", "node-a")
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(data_dir)})
    process.start()
    yield process, token
    process.stop()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job=HOSTILE, stream=HOSTILE)
def test_hostile_ids_are_refused_cleanly(
    bound: tuple[ServiceProcess, Token], job: str, stream: str
) -> None:
    service, token = bound
    response = httpx.post(
        f"{service.base_url}/v1/jobs/{quote(job, safe='')}/logs",
        params={"node": "node-a", "stream": stream},
        content=b"step 1 loss 2.0\n",
        headers={"Content-Type": "text/plain", **token.headers},
    )
    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")
    if response.status_code == 200:
        written = response.json()["stream"]
        assert written == "node-a" or written.startswith("node-a/")
