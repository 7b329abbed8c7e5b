"""Ingest over real HTTP against a real `diagnoser serve`, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess

TEXT = {"Content-Type": "text/plain"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    env = backend_env(request, tmp_path_factory.mktemp("data"))
    env["DIAGNOSER_INGEST__IDLE_TIMEOUT_S"] = "1"
    env["DIAGNOSER_INGEST__MAX_JSON_BODY_BYTES"] = "4096"
    env["DIAGNOSER_INGEST__MAX_LINE_BYTES"] = "1024"
    yield from run_service(env)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def quiet_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The default idle timeout (60 s): an upload may stay open and silent for a while."""
    yield from run_service(backend_env(request, tmp_path_factory.mktemp("data")))


def logs_url(service: ServiceProcess, job: str) -> str:
    return f"{service.base_url}/v1/jobs/{job}/logs"


def job(service: ServiceProcess, job_id: str) -> dict[str, object]:
    response = httpx.get(f"{service.base_url}/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def stream_status(service: ServiceProcess, job_id: str, node: str) -> dict[str, int]:
    body: dict[str, int] = httpx.get(logs_url(service, job_id), params={"node": node}).json()
    return body


def post(
    service: ServiceProcess, job_id: str, content: bytes, **params: str | int
) -> httpx.Response:
    return httpx.post(logs_url(service, job_id), params=params, content=content, headers=TEXT)


def test_lines_and_offsets_survive_awkward_chunk_boundaries(service: ServiceProcess) -> None:
    data = "step 1 loss 2.5\r\nrank 3 température élevée ✓\r\nlast\n".encode()
    # Every split point: inside \r\n and inside multibyte characters included.
    pieces = [data[i : i + 1] for i in range(len(data))]

    async def upload() -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        async with httpx.AsyncClient() as client:
            return await client.post(
                logs_url(service, "chunks"),
                params={"node": "n1", "offset": 0},
                content=body(),
                headers=TEXT,
            )

    response = asyncio.run(upload())
    assert response.status_code == 200, response.text
    assert response.json()["lines_accepted"] == 3
    assert response.json()["next_offset"] == len(data)


def test_a_resend_of_overlapping_bytes_is_deduplicated(service: ServiceProcess) -> None:
    lines = b"".join(f"iteration {i} loss {i / 7:.4f}\n".encode() for i in range(100))
    first = post(service, "resend", lines[:1000], node="n1", offset=0)
    # The first body ends mid-line: only whole lines are committed, the rest must be resent.
    committed = first.json()["next_offset"]
    assert committed < 1000
    assert lines[committed - 1 : committed] == b"\n"
    again = post(service, "resend", lines[500:], node="n1", offset=500)
    assert again.status_code == 200
    assert again.json()["duplicate_bytes"] == committed - 500
    assert again.json()["next_offset"] == len(lines)
    assert stream_status(service, "resend", "n1")["lines"] == 100
    # The same bytes once more: nothing new.
    third = post(service, "resend", lines, node="n1", offset=0)
    assert third.json()["lines_accepted"] == 0
    assert third.json()["duplicate_bytes"] == len(lines)
    # The stream's own count, which a client that lost receipts can trust over their sum.
    assert [r.json()["stream_lines"] for r in (first, again, third)] == [
        lines[:committed].count(b"\n"),
        100,
        100,
    ]


def test_a_gap_is_refused_with_the_expected_offset(service: ServiceProcess) -> None:
    post(service, "gap", b"one\ntwo\n", node="n1", offset=0)
    response = post(service, "gap", b"four\n", node="n1", offset=100)
    assert response.status_code == 409
    assert response.json()["error"] == "offset_gap"
    assert response.json()["expected_offset"] == 8
    assert stream_status(service, "gap", "n1")["lines"] == 2


def test_appends_without_offset_count_an_unterminated_last_line(service: ServiceProcess) -> None:
    assert post(service, "append", b"a\nb", node="n1").json()["next_offset"] == 3
    assert post(service, "append", b"c\n", node="n1").json()["next_offset"] == 5
    assert stream_status(service, "append", "n1")["lines"] == 3


def test_two_hundred_concurrent_streams_lose_and_double_nothing(service: ServiceProcess) -> None:
    per_stream = 500
    body = b"".join(f"[rank{i}]: step {i} ok\n".encode() for i in range(per_stream))

    async def send_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        logs_url(service, "wide"),
                        params={"node": f"node-{n // 8}", "rank": n, "offset": 0},
                        content=body,
                        headers=TEXT,
                    )
                    for n in range(200)
                )
            )

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * 200
    detail = job(service, "wide")
    assert detail["lines_received"] == 200 * per_stream
    assert detail["bytes_received"] == 200 * len(body)
    assert len(detail["streams"]) == 200  # type: ignore[arg-type]
    assert detail["nodes"] == sorted(f"node-{n}" for n in range(25))


def test_hostile_bytes_are_accepted_and_giant_lines_truncated(service: ServiceProcess) -> None:
    body = b"ok\n\xff\xfe bad utf-8\nnul\x00byte\n\x1b[31mred\x1b[0m\n" + b"x" * 5000 + b"\n"
    response = post(service, "hostile", body, node="n1", offset=0)
    assert response.status_code == 200
    assert response.json()["lines_accepted"] == 5
    assert response.json()["truncated_lines"] == 1
    assert response.json()["next_offset"] == len(body)


def test_fluent_bit_json_and_ndjson_records(service: ServiceProcess) -> None:
    fluent_bit = [
        {"date": 1714557600.25, "log": "NCCL INFO Bootstrap : Using eth0\n"},
        {"date": 1714557601.5, "log": "step 10", "kubernetes": {"host": "gpu-7"}},
    ]
    response = httpx.post(logs_url(service, "records"), params={"node": "gpu-1"}, json=fluent_bit)
    assert response.status_code == 200, response.text
    ndjson = b'{"line": "hello", "ts": "2024-05-01T10:00:00Z"}\n{"line": "r3", "rank": 3}\n'
    response = httpx.post(
        logs_url(service, "records"),
        params={"node": "gpu-1"},
        content=ndjson,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert response.status_code == 200
    streams = {s["stream"]: s["lines"] for s in job(service, "records")["streams"]}  # type: ignore[attr-defined]
    assert streams == {"gpu-1": 2, "gpu-7": 1, "gpu-1/3": 1}


@pytest.mark.parametrize(
    ("content_type", "body", "status", "error"),
    [
        ("application/x-www-form-urlencoded", b"a=b", 415, "unsupported_media_type"),
        ("application/x-ndjson", b'{"line": 1}\n', 422, "invalid_request"),
        ("application/json", b"[{", 422, "invalid_request"),
        (
            "application/json",
            b"[" + b'{"log": "x"},' * 500 + b'{"log": "x"}]',
            413,
            "payload_too_large",
        ),
    ],
)
def test_bad_bodies_get_a_clear_json_error(
    service: ServiceProcess, content_type: str, body: bytes, status: int, error: str
) -> None:
    response = httpx.post(
        logs_url(service, "bad"),
        params={"node": "n1"},
        content=body,
        headers={"Content-Type": content_type},
    )
    assert response.status_code == status
    assert response.json()["error"] == error
    assert response.json()["detail"]


def test_missing_node_is_a_422_naming_the_parameter(service: ServiceProcess) -> None:
    response = post(service, "bad", b"x\n")
    assert response.status_code == 422
    assert "node" in response.json()["detail"]


def test_an_idle_upload_is_closed_and_keeps_what_arrived(service: ServiceProcess) -> None:
    async def stall() -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"before the stall\nhalf a li"
            await asyncio.sleep(3)
            yield b"ne\n"

        async with httpx.AsyncClient(timeout=30) as client:
            return await client.post(
                logs_url(service, "idle"),
                params={"node": "n1", "offset": 0},
                content=body(),
                headers=TEXT,
            )

    response = asyncio.run(stall())
    assert response.status_code == 408
    assert response.json()["next_offset"] == len(b"before the stall\n")
    assert stream_status(service, "idle", "n1")["lines"] == 1


def requests_counted(service: ServiceProcess, status: str) -> float:
    wanted = f'route="/v1/jobs/{{job_id}}/logs",status="{status}"'
    text = httpx.get(f"{service.base_url}/metrics").text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if wanted in x)


def test_a_client_that_closes_mid_upload_keeps_its_lines_and_is_no_server_error(
    quiet_service: ServiceProcess,
) -> None:
    """A shipper killed mid-body: its whole lines are committed, and the request counts as 499
    (client closed), not as the 5xx the service's alert pages on. On the 60 s idle-timeout
    service: the 1 s one could close the silent upload itself (408) before the client does."""
    service = quiet_service
    before = requests_counted(service, "499"), requests_counted(service, "500")
    body = b"step 1 ok\nstep 2 ok\nhalf a li"
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/jobs/gone/logs?node=n1&offset=0 HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n"
        )
        deadline = time.monotonic() + 60
        while stream_status(service, "gone", "n1").get("lines") != 2:
            assert time.monotonic() < deadline, "the first lines were never committed"
            time.sleep(0.05)
    deadline = time.monotonic() + 60
    while requests_counted(service, "499") == before[0]:
        assert time.monotonic() < deadline, "the closed request was never counted"
        time.sleep(0.05)
    assert requests_counted(service, "500") == before[1]
    status = stream_status(service, "gone", "n1")
    assert (status["lines"], status["committed_offset"]) == (2, len(b"step 1 ok\nstep 2 ok\n"))


def test_a_busy_stream_answers_429_with_retry_after(quiet_service: ServiceProcess) -> None:
    service = quiet_service  # a 60 s idle timeout: the held upload is not closed while we wait

    async def race() -> tuple[httpx.Response, httpx.Response]:
        gate = asyncio.Event()

        async def slow() -> AsyncIterator[bytes]:
            yield b"first\n"
            await gate.wait()
            yield b"second\n"

        async with httpx.AsyncClient(timeout=60) as client:
            first = asyncio.create_task(
                client.post(
                    logs_url(service, "busy"),
                    params={"node": "n1", "offset": 0},
                    content=slow(),
                    headers=TEXT,
                )
            )
            # The service commits the first line while the upload stays open: from then on it
            # holds the stream (no fixed sleep: a loaded machine may take seconds to get there).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = await client.get(logs_url(service, "busy"), params={"node": "n1"})
                if status.status_code == 200 and status.json().get("lines") == 1:
                    break
                await asyncio.sleep(0.05)
            second = await client.post(
                logs_url(service, "busy"), params={"node": "n1"}, content=b"x\n", headers=TEXT
            )
            gate.set()
            return await first, second

    first, second = asyncio.run(race())
    assert first.status_code == 200
    assert first.json()["lines_accepted"] == 2
    assert second.status_code == 429
    assert second.headers["Retry-After"] == "1"
    assert second.json()["error"] == "stream_busy"


def test_lifecycle_events_are_evidence_on_the_job(service: ServiceProcess) -> None:
    url = f"{service.base_url}/v1/jobs/life/events"
    assert httpx.post(url, json={"type": "started", "node": "n1", "rank": 0}).status_code == 201
    exited = httpx.post(url, json={"type": "exited", "node": "n1", "rank": 0, "exit_code": 137})
    assert exited.json()["signal"] == "SIGKILL"
    assert httpx.post(url, json={"type": "crashed"}).status_code == 422
    exits = job(service, "life")["exits"]
    assert [(e["exit_code"], e["signal"]) for e in exits] == [(137, "SIGKILL")]  # type: ignore[attr-defined]


def test_job_metadata_from_headers_and_put(service: ServiceProcess) -> None:
    headers = {**TEXT, "X-Diagnoser-Job-Family": "llama-70b", "X-Diagnoser-Job-Kind": "PyTorchJob"}
    httpx.post(logs_url(service, "meta"), params={"node": "n1"}, content=b"x\n", headers=headers)
    put = httpx.put(
        f"{service.base_url}/v1/jobs/meta", json={"namespace": "team-a", "name": "run7"}
    )
    assert put.status_code == 200
    detail = job(service, "meta")
    assert (detail["family"], detail["kind"], detail["namespace"], detail["name"]) == (
        "llama-70b",
        "PyTorchJob",
        "team-a",
        "run7",
    )
    assert httpx.put(f"{service.base_url}/v1/jobs/meta", json={"owner": "x"}).status_code == 422


def test_job_list_pages_by_recent_activity(service: ServiceProcess) -> None:
    for n in range(3):
        post(service, f"page-{n}", b"x\n", node="n1")
        time.sleep(0.01)
    first = httpx.get(f"{service.base_url}/v1/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in first["jobs"]] == ["page-2", "page-1"]
    second = httpx.get(
        f"{service.base_url}/v1/jobs", params={"limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert second["jobs"][0]["id"] == "page-0"


def test_acknowledged_lines_survive_a_restart(tmp_path: Path) -> None:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)})
    process.start()
    try:
        assert post(process, "durable", b"a\nb\nc\n", node="n1", offset=0).status_code == 200
        process.stop()
        process.start()
        status = stream_status(process, "durable", "n1")
        assert (status["committed_offset"], status["lines"]) == (6, 3)
    finally:
        process.stop()


def test_gzipped_fluent_bit_bodies_and_zip_bombs(service: ServiceProcess) -> None:
    records = json.dumps([{"date": "2024-05-01T10:00:00.000681Z", "log": "x"}] * 10).encode()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    url = logs_url(service, "gzip")
    response = httpx.post(
        url, params={"node": "n1"}, content=gzip.compress(records), headers=headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["lines_accepted"] == 10
    bomb = gzip.compress(b"[" + b" " * 50_000_000 + b"]")
    response = httpx.post(url, params={"node": "n1"}, content=bomb, headers=headers)
    assert response.status_code == 413


def test_evidence_text_is_clean_of_colour_codes_and_nul(service: ServiceProcess) -> None:
    xid = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
    body = f"\x1b[31m[74889.644138] {xid}\x1b[0m\x00\r\n".encode()
    assert post(service, "clean", body, node="gpu-1", offset=0).status_code == 200
    [diagnosis] = httpx.get(f"{service.base_url}/v1/jobs/clean/diagnoses").json()["diagnoses"]
    assert diagnosis["evidence"][0]["text"] == f"[74889.644138] {xid}"
    assert diagnosis["evidence"][0]["offset"] == 0


def test_over_the_admission_limit_clients_are_told_to_retry(tmp_path: Path) -> None:
    process = ServiceProcess(
        env={
            "DIAGNOSER_DATA_DIR": str(tmp_path),
            "DIAGNOSER_INGEST__MAX_CONCURRENT_REQUESTS": "1",
        }
    )
    process.start()

    async def crowd() -> tuple[httpx.Response, httpx.Response]:
        gate = asyncio.Event()

        async def slow() -> AsyncIterator[bytes]:
            yield b"first\n"
            await gate.wait()

        async with httpx.AsyncClient(timeout=30) as client:
            holder = asyncio.create_task(
                client.post(
                    logs_url(process, "crowd"), params={"node": "a"}, content=slow(), headers=TEXT
                )
            )
            await asyncio.sleep(0.3)
            refused = await client.post(
                logs_url(process, "crowd"), params={"node": "b"}, content=b"x\n", headers=TEXT
            )
            gate.set()
            return await holder, refused

    try:
        held, refused = asyncio.run(crowd())
        assert held.status_code == 200
        assert refused.status_code == 429
        assert refused.json()["error"] == "too_many_requests"
        assert refused.headers["Retry-After"] == "1"
    finally:
        process.stop()


def _diagnosed_while_open(service: ServiceProcess) -> None:
    tail = (
        b"[rank3]: iteration 1200 | loss 1.873 | lr 3.0e-4\n"
        b"[rank3]: Traceback (most recent call last):\n"
        b'[rank3]:   File "/workspace/train.py", line 212, in <module>\n'
        b"[rank3]:     loss.backward()\n"
        b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        b"GPU 3 has a total capacity of 79.15 GiB of which 1.12 GiB is free.\n"
    )
    url = f"{service.base_url}/v1/jobs/open-tail/diagnoses"

    async def upload_and_poll() -> tuple[list[dict[str, object]], httpx.Response]:
        gate = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield tail
            await gate.wait()  # nothing follows the failure until the test has looked

        async with httpx.AsyncClient(timeout=60) as client:
            upload = asyncio.create_task(
                client.post(
                    logs_url(service, "open-tail"),
                    params={"node": "gpu-017", "rank": 3, "offset": 0},
                    content=body(),
                    headers=TEXT,
                )
            )
            deadline = time.monotonic() + 20
            diagnoses: list[dict[str, object]] = []
            while not diagnoses and time.monotonic() < deadline and not upload.done():
                await asyncio.sleep(0.2)
                diagnoses = (await client.get(url)).json()["diagnoses"]
            still_open = not upload.done()
            gate.set()
            response = await upload
            assert still_open, response.text
            return diagnoses, response

    diagnoses, response = asyncio.run(upload_and_poll())
    assert [d["failure_type"] for d in diagnoses] == ["cuda_oom"]
    assert response.status_code == 200
    assert response.json()["next_offset"] == len(tail)


def test_a_failure_at_the_tail_of_an_open_upload_is_diagnosed_while_it_stays_open(
    quiet_service: ServiceProcess,
) -> None:
    """The process that printed the error died; its launcher's upload stays open, silent."""
    _diagnosed_while_open(quiet_service)


def test_a_failure_line_is_committed_at_once_not_at_the_next_timed_commit(
    tmp_path: Path,
) -> None:
    """Benign lines of open uploads wait for the shared commit tick (one transaction for all);
    lines that bring the diagnosis news are committed with their chunk: with the tick an hour
    away, the failure is still diagnosed while its upload stays open."""
    env = {"DIAGNOSER_DATA_DIR": str(tmp_path), "DIAGNOSER_INGEST__COMMIT_EVERY_S": "3600"}
    for process in run_service(env):
        _diagnosed_while_open(process)


def test_the_readme_curl_example_posts_a_shipped_log_that_is_diagnosed(
    service: ServiceProcess,
) -> None:
    readme = (REPO / "README.md").read_text()
    posted = re.findall(r"--data-binary @(\S+)", readme)
    assert posted
    for name in posted:
        assert (REPO / name).is_file(), f"README posts {name}, which is not in the repository"
    example = (REPO / posted[0]).read_bytes()
    response = post(service, "readme-example", example, node="gpu-017", rank=3, offset=0)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["lines_accepted"] == example.count(b"\n")
    assert answer["warnings"] == []
    assert len(answer["diagnoses"]) == 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-ndjson"])
def test_an_empty_body_is_answered_with_a_warning(
    service: ServiceProcess, content_type: str
) -> None:
    response = httpx.post(
        logs_url(service, "empty"),
        params={"node": "n1"},
        content=b"",
        headers={"Content-Type": content_type},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["lines_accepted"] == 0
    assert answer["warnings"] == ["empty body: no lines received"]
    assert {"job_id", "stream", "duplicate_bytes", "truncated_lines", "next_offset"} <= set(answer)


def test_gzipped_text_is_decoded_as_it_streams_and_bombs_are_refused(
    service: ServiceProcess,
) -> None:
    lines = b"".join(
        f"iteration {i} | lm loss {2 - i / 1000:.4f}\n".encode() for i in range(100)
    )  # under the 4 KiB cap
    xid = b"NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    compressed = gzip.compress(lines) + gzip.compress(xid)  # two members, as `cat a.gz b.gz`

    async def upload() -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for i in range(0, len(compressed), 100):
                yield compressed[i : i + 100]

        async with httpx.AsyncClient(timeout=30) as client:
            return await client.post(
                logs_url(service, "gzip-text"),
                params={"node": "gpu-3", "offset": 0},
                content=body(),
                headers={**TEXT, "Content-Encoding": "gzip"},
            )

    response = asyncio.run(upload())
    assert response.status_code == 200, response.text
    assert response.json()["lines_accepted"] == 101
    assert response.json()["next_offset"] == len(lines) + len(xid)
    [diagnosis] = httpx.get(f"{service.base_url}/v1/jobs/gzip-text/diagnoses").json()["diagnoses"]
    assert diagnosis["evidence"][0]["text"] == xid.decode().strip()

    gzipped = {**TEXT, "Content-Encoding": "gzip"}
    bomb = gzip.compress(b"x\n" * 25_000_000)  # 50 MB of lines in about 50 KB
    response = httpx.post(
        logs_url(service, "gzip-bomb"), params={"node": "n1"}, content=bomb, headers=gzipped
    )
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    cut = httpx.post(
        logs_url(service, "gzip-cut"),
        params={"node": "n1"},
        content=gzip.compress(lines)[:-20],
        headers=gzipped,
    )
    assert cut.status_code == 422
    assert cut.json()["error"] == "invalid_request"


@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
def test_an_unknown_content_encoding_is_415(service: ServiceProcess, content_type: str) -> None:
    response = httpx.post(
        logs_url(service, "brotli"),
        params={"node": "n1"},
        content=b"\x8b\x03\x80not really brotli",
        headers={"Content-Type": content_type, "Content-Encoding": "br"},
    )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert "br" in response.json()["detail"]
    assert httpx.get(logs_url(service, "brotli"), params={"node": "n1"}).status_code == 404


XID = "NVRM: Xid (PCI:0000:2b:00): 79, pid=2412, GPU has fallen off the bus."


def evidence_times(service: ServiceProcess, job_id: str) -> list[float]:
    [diagnosis] = httpx.get(f"{service.base_url}/v1/jobs/{job_id}/diagnoses").json()["diagnoses"]
    return [item["time"] for item in diagnosis["evidence"]]


def test_a_records_own_time_is_the_evidence_time(service: ServiceProcess) -> None:
    """A Fluent Bit buffer replayed after an outage: the lines are hours old when they arrive."""
    written = time.time() - 3 * 3600
    ndjson = (
        json.dumps({"line": "iteration 10 | lm loss 1.93", "ts": written - 60})
        + "\n"
        # Several records, RFC 3339: the Xid record's own time, not the first record's.
        + json.dumps({"line": XID, "ts": datetime.fromtimestamp(written, UTC).isoformat()})
        + "\n"
    ).encode()
    response = httpx.post(
        logs_url(service, "record-time"),
        params={"node": "gpu-3"},
        content=ndjson,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert response.status_code == 200, response.text
    assert evidence_times(service, "record-time") == [pytest.approx(written, abs=1e-3)]
    fluent_bit = [{"date": written + 0.25, "log": XID + "\n"}]
    response = httpx.post(logs_url(service, "fb-time"), params={"node": "gpu-3"}, json=fluent_bit)
    assert response.status_code == 200, response.text
    assert evidence_times(service, "fb-time") == [pytest.approx(written + 0.25, abs=1e-3)]


@pytest.mark.parametrize(
    "ts",
    [
        0,  # a sender that fills the field blindly
        time.time() - 30 * 24 * 3600,  # a month old: older than any buffer replay
        time.time() + 3600,  # an hour ahead of the server's clock
        time.time() * 1000,  # milliseconds sent as seconds
    ],
    ids=["zero", "month-old", "hour-ahead", "milliseconds"],
)
def test_an_insane_record_time_gives_way_to_the_receive_time(
    service: ServiceProcess, ts: float
) -> None:
    job_id = f"insane-{int(ts)}"
    before = time.time()
    response = httpx.post(
        logs_url(service, job_id),
        params={"node": "gpu-3"},
        content=json.dumps({"line": XID, "ts": ts}).encode() + b"\n",
        headers={"Content-Type": "application/x-ndjson"},
    )
    after = time.time()
    assert response.status_code == 200, response.text
    [evidence_time] = evidence_times(service, job_id)
    assert before - 1 <= evidence_time <= after + 1
