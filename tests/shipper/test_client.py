"""The upload loop over real HTTP: EOF, disconnects, 503, 409, rotation and truncation live."""

from __future__ import annotations

import io
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from diagnoser.shipper.client import (
    ExitCode,
    ShipError,
    Shipper,
    Source,
    Stop,
    StreamTarget,
    UploadPolicy,
)
from diagnoser.shipper.follow import FileFollower
from diagnoser.shipper.pipe import PipeReader
from diagnoser.shipper.progress import Progress
from tests.servers import wait_until
from tests.shipper.conftest import LogServer
from tests.shipper.contract_server import UvicornThread

FAST = UploadPolicy(
    max_request_bytes=256 * 1024,
    max_request_seconds=0.5,
    poll_seconds=0.02,
    start_timeout_s=1.0,
    backoff_base_s=0.02,
    backoff_cap_s=0.2,
)
NODE = "n1"


def log_lines(first: int, count: int, tag: str = "") -> bytes:
    return b"".join(
        f"{tag}step {i} loss {1 / (i + 1):.6f} rank 0 tokens/s 12345.6\n".encode()
        for i in range(first, first + count)
    )


@dataclass
class Run:
    """A shipper, its captured warnings, and (when started in a thread) its outcome."""

    shipper: Shipper
    output: io.StringIO
    error: BaseException | None = None
    thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Run:
        def target() -> None:
            try:
                self.shipper.run()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        return self

    def finish(self) -> None:
        self.shipper.stop.set()
        assert self.thread is not None
        self.thread.join(20)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.shipper.http.close()


def make_run(
    runs: list[Run],
    server: LogServer,
    source: Callable[..., Source],
    job: str,
    policy: UploadPolicy = FAST,
    token: str | None = None,
) -> Run:
    """`source` is built with `notify=`, so that its notes (rotation...) land in the output."""
    output = io.StringIO()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    progress = Progress(Console(file=output, width=200), live=False)
    shipper = Shipper(
        target=StreamTarget(server=server.url, job=job, node=NODE),
        source=source(notify=progress.warn),
        http=httpx.Client(headers=headers, timeout=10),
        progress=progress,
        policy=policy,
        stop=Stop(),
    )
    run = Run(shipper, output)
    runs.append(run)
    return run


def assert_stream_is(server: LogServer, job: str, expected: bytes) -> None:
    state = server.state(job, NODE)
    assert state is not None
    assert state.committed_offset == len(expected)
    assert state.lines == expected.count(b"\n")
    if server.contract is not None:
        assert server.contract.content(job, NODE) == expected


def test_ships_a_file_to_eof(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    data = log_lines(0, 20_000)
    path = tmp_path / "train.log"
    path.write_bytes(data)
    run = make_run(runs, log_server, partial(FileFollower, path, follow=False), job)
    run.shipper.run()
    assert_stream_is(log_server, job, data)
    assert run.shipper.progress.stats.requests >= len(data) // FAST.max_request_bytes
    assert run.shipper.progress.stats.lines_accepted == 20_000


def test_a_second_run_ships_only_what_was_appended(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(log_lines(0, 1000))
    make_run(runs, log_server, partial(FileFollower, path, follow=False), job).shipper.run()
    with path.open("ab") as log:
        log.write(log_lines(1000, 500))
    again = make_run(runs, log_server, partial(FileFollower, path, follow=False), job)
    again.shipper.run()
    assert_stream_is(log_server, job, path.read_bytes())
    assert again.shipper.progress.stats.lines_accepted == 500
    assert "500 lines accepted" in again.shipper.progress.summary("here")
    assert "1500 lines in the stream" in again.shipper.progress.summary("here")


def test_a_file_replaced_since_the_last_run_continues_the_stream(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    path = tmp_path / "train.log"
    before = log_lines(0, 1000)
    path.write_bytes(before)
    make_run(runs, log_server, partial(FileFollower, path, follow=False), job).shipper.run()
    after = log_lines(0, 10, tag="new ")
    path.write_bytes(after)  # shorter than what the server has: a new file
    make_run(runs, log_server, partial(FileFollower, path, follow=False), job).shipper.run()
    assert_stream_is(log_server, job, before + after)


def test_a_last_line_without_newline_is_shipped_too(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    path = tmp_path / "crash.log"
    data = log_lines(0, 100) + b"Segmentation fault (core dumped)"
    path.write_bytes(data)
    make_run(runs, log_server, partial(FileFollower, path, follow=False), job).shipper.run()
    state = log_server.state(job, NODE)
    assert state is not None
    assert state.committed_offset == len(data)
    assert state.lines == 101


def ship_through_four_cuts(
    server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> tuple[Run, bytes]:
    """40,000 lines (about 2 MB) shipped through a proxy that cuts four uploads mid-body."""
    data = log_lines(0, 40_000)
    path = tmp_path / "train.log"
    path.write_bytes(data)
    server.proxy.cut_after(300_000, times=4)
    run = make_run(runs, server, partial(FileFollower, path, follow=False), job)
    run.shipper.run()
    assert server.proxy.cuts == 4
    return run, data


def test_resumes_after_connections_drop_mid_upload_without_loss_or_doubling(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    run, data = ship_through_four_cuts(log_server, job, tmp_path, runs)
    assert run.shipper.progress.stats.retries >= 4
    assert "upload interrupted" in run.output.getvalue()
    assert_stream_is(log_server, job, data)
    # The server committed part of each cut request, whose receipt never came back: the
    # count is the server's, not the sum of the receipts.
    assert run.shipper.progress.stats.lines_accepted == 40_000
    summary = run.shipper.progress.summary("here")
    assert "40000 lines accepted" in summary
    assert "40000 lines in the stream" in summary


def test_counts_the_lines_of_a_cut_upload_committed_after_the_resync(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    # A cut upload's lines land just after the shipper re-read the offset: the resent upload
    # skips them as duplicates, so its receipt leaves them out. Only the stream's own count,
    # in the receipt, gets the total right.
    assert contract_server.contract is not None
    contract_server.contract.commit_cut_uploads_late()
    run, data = ship_through_four_cuts(contract_server, job, tmp_path, runs)
    assert_stream_is(contract_server, job, data)
    assert run.shipper.progress.stats.lines_accepted == 40_000
    assert "40000 lines accepted" in run.shipper.progress.summary("here")


def test_honours_503_with_retry_after(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    assert contract_server.contract is not None
    contract_server.contract.fail_next(2, status=503, retry_after="0.3")
    data = log_lines(0, 100)
    path = tmp_path / "train.log"
    path.write_bytes(data)
    run = make_run(runs, contract_server, partial(FileFollower, path, follow=False), job)
    started = time.monotonic()
    run.shipper.run()
    assert time.monotonic() - started >= 0.6
    assert "server answered 503 unavailable: injected failure" in run.output.getvalue()
    assert_stream_is(contract_server, job, data)


def test_offset_gap_resumes_from_the_expected_offset(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    assert contract_server.contract is not None
    path = tmp_path / "train.log"
    path.write_bytes(log_lines(0, 100))
    make_run(runs, contract_server, partial(FileFollower, path, follow=False), job).shipper.run()
    with path.open("ab") as log:
        log.write(log_lines(100, 100))
    # A stale read: the shipper is told 1000 bytes more than the server has, posts there, 409.
    contract_server.contract.skew_next_gets(1, by=1000)
    run = make_run(runs, contract_server, partial(FileFollower, path, follow=False), job)
    run.shipper.run()
    assert "server expects offset" in run.output.getvalue()
    assert_stream_is(contract_server, job, path.read_bytes())


def test_bad_token_is_final(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    assert contract_server.contract is not None
    contract_server.contract.token = "right"
    path = tmp_path / "train.log"
    path.write_bytes(b"x\n")
    source = partial(FileFollower, path, follow=False)
    run = make_run(runs, contract_server, source, job, token="wrong")
    with pytest.raises(ShipError) as failure:
        run.shipper.run()
    assert failure.value.exit_code == ExitCode.AUTH
    assert "authentication failed (401 unauthorized" in str(failure.value)


def test_follows_appends_rotation_and_truncation_through_drops(
    log_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    run = make_run(runs, log_server, partial(FileFollower, path, follow=True), job).start()
    shipped = bytearray()

    def append(data: bytes) -> None:
        with path.open("ab") as log:
            for i in range(0, len(data), 7000):  # several writes, some mid-line
                log.write(data[i : i + 7000])
                log.flush()
        shipped.extend(data)

    def settled() -> bool:
        return log_server.committed(job, NODE) == len(shipped)

    append(log_lines(0, 3000))
    wait_until(settled, 20, "first batch")

    log_server.proxy.cut_after(50_000, times=2)
    append(log_lines(3000, 1000))
    path.rename(tmp_path / "train.log.1")  # rotated while uploads are being cut
    append(log_lines(0, 2000, tag="rotated "))
    wait_until(settled, 20, "after rotation")
    assert log_server.proxy.cuts == 2

    path.write_bytes(b"")  # truncated (copytruncate), then written again
    shipped.extend(b"")
    append(log_lines(0, 50, tag="truncated "))
    wait_until(settled, 20, "after truncation")

    run.finish()
    assert_stream_is(log_server, job, bytes(shipped))
    notes = run.output.getvalue()
    assert "was rotated" in notes
    assert "was truncated" in notes


def test_rides_out_a_server_restart_while_following(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    assert contract_server.contract is not None
    path = tmp_path / "train.log"
    path.write_bytes(log_lines(0, 500))
    run = make_run(runs, contract_server, partial(FileFollower, path, follow=True), job).start()
    wait_until(lambda: contract_server.committed(job, NODE) == path.stat().st_size, 20, "start")

    # The server goes away (connections refused), the job keeps logging, the server returns
    # with its committed state on another port behind the same address.
    upstream = contract_server.proxy.upstream
    replacement = UvicornThread(contract_server.contract.app)
    contract_server.proxy.upstream = ("127.0.0.1", 1)
    with path.open("ab") as log:
        log.write(log_lines(500, 500))
    time.sleep(0.3)
    replacement.start()
    contract_server.proxy.upstream = ("127.0.0.1", replacement.port)
    try:
        wait_until(
            lambda: contract_server.committed(job, NODE) == path.stat().st_size, 20, "resume"
        )
        run.finish()
    finally:
        replacement.stop()
        contract_server.proxy.upstream = upstream
    assert_stream_is(contract_server, job, path.read_bytes())


def test_ships_a_pipe(log_server: LogServer, job: str, runs: list[Run]) -> None:
    read_fd, write_fd = os.pipe()
    data = log_lines(0, 5000) + b"no newline at the end"
    source = partial(PipeReader, read_fd)
    run = make_run(runs, log_server, source, job).start()
    try:
        for i in range(0, len(data), 50_000):
            os.write(write_fd, data[i : i + 50_000])
    finally:
        os.close(write_fd)
    assert run.thread is not None
    run.thread.join(20)
    os.close(read_fd)
    assert run.error is None
    state = log_server.state(job, NODE)
    assert state is not None
    assert state.committed_offset == len(data)
    assert state.lines == 5001


def test_shippers_started_together_spread_their_uploads_over_the_interval(
    contract_server: LogServer, job: str, tmp_path: Path, runs: list[Run]
) -> None:
    """Twelve nodes' shippers start in the same instant: their first uploads end at random
    points of the interval, not together, and every later upload stays open for at least the
    last tenth of the limit, so the fleet stays spread at about one upload per limit."""
    limit = 0.5
    policy = replace(FAST, max_request_seconds=limit, max_request_bytes=1 << 30)
    nodes = [f"node-{i:02d}" for i in range(12)]
    paths = [tmp_path / f"{node}.log" for node in nodes]
    for path in paths:
        path.write_bytes(b"")
    for i, (node, path) in enumerate(zip(nodes, paths, strict=True)):
        run = make_run(runs, contract_server, partial(FileFollower, path, follow=True), job, policy)
        run.shipper.target = replace(run.shipper.target, node=node)
        run.shipper.rng = random.Random(i)
    stop = threading.Event()

    def write() -> None:
        step = 0
        while not stop.wait(0.02):
            for path in paths:
                with path.open("ab") as log:
                    log.write(log_lines(step, 1))
            step += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    for run in runs:
        run.start()
    assert contract_server.contract is not None
    opened = contract_server.contract.opened

    def four_each() -> bool:
        return all(sum(1 for s, _ in list(opened) if s == node) >= 4 for node in nodes)

    wait_until(four_each, 20, "four uploads per node")
    stop.set()
    for run in runs:
        run.finish()
    writer.join(5)

    times = {node: [at for s, at in opened if s == node] for node in nodes}
    first_lengths = [at[1] - at[0] for at in times.values()]
    later_lengths = [b - a for at in times.values() for a, b in itertools.pairwise(at[1:4])]
    assert max(first_lengths) - min(first_lengths) > 0.4 * limit
    assert min(later_lengths) >= 0.9 * limit
