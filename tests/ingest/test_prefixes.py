"""Launcher prefixes (torchrun, torchelastic, srun) and Kubernetes CRI records, as framed."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnoser.ingest.framing import Framer, frame
from diagnoser.ingest.prefixes import LauncherPrefixes, line_heads

NCCL_TIMEOUT = (
    "[rank3]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600047 milliseconds before timing out."
)
SOCKET_WARNING = (
    "[default0]:[W socket.cpp:464] [c10d] The server socket has failed to bind to "
    "[::]:29500 (errno: 98 - Address already in use)."
)


def ns(text: str) -> int:
    """Epoch nanoseconds of an ISO time with at most microseconds, plus extra nanoseconds."""
    moment = datetime.fromisoformat(text)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def test_torchrun_global_rank_read_and_text_kept_verbatim() -> None:
    batch = frame(f"{NCCL_TIMEOUT}\n[rank12]: Traceback (most recent call last):\n".encode())
    assert batch.lines == [NCCL_TIMEOUT, "[rank12]: Traceback (most recent call last):"]
    assert batch.ranks == [3, 12]
    assert batch.local_ranks is None
    assert batch.tasks is None


def test_torchelastic_role_prefix_is_a_local_rank_not_a_global_one() -> None:
    batch = frame(f"{SOCKET_WARNING}\n[trainer7]:loss=1.5\n".encode())
    assert batch.lines[0] == SOCKET_WARNING
    assert batch.local_ranks == [0, 7]
    assert batch.ranks is None


def test_srun_label_is_the_task_and_the_rank() -> None:
    data = b"0: Traceback (most recent call last):\n 12: RuntimeError: CUDA error\n 3:\n"
    batch = frame(data)
    assert batch.lines == [
        "0: Traceback (most recent call last):",
        " 12: RuntimeError: CUDA error",
        " 3:",
    ]
    assert batch.tasks == [0, 12, 3]
    assert batch.ranks == [0, 12, 3]


def test_srun_around_torchrun() -> None:
    data = b"1: [default2]:[W socket.cpp:464] bind failed\n0: [rank5]:NCCL error\n"
    batch = frame(data)
    # One torchrun per node: the task id is a node index, so it is not taken as a rank.
    assert batch.tasks == [1, 0]
    assert batch.local_ranks == [2, None]
    assert batch.ranks == [None, 5]


def test_unprefixed_lines_among_prefixed_ones_get_none() -> None:
    data = (
        b"W0501 10:00:00.000000 140 torch/distributed/run.py:779] Setting OMP_NUM_THREADS\n"
        b"[rank1]:hello\n"
        b"plain\n"
    )
    batch = frame(data)
    assert batch.ranks == [None, 1, None]


@pytest.mark.parametrize(
    "line",
    [
        "12:30:01 INFO step 100",
        "epoch 3: loss 1.2",
        "ERROR [Rank 3] Watchdog caught collective operation timeout",
        "[rank3] missing colon",
        "x [rank3]: not at the start",
        "[W socket.cpp:464] [c10d] The server socket has failed",
        "2024-05-01 10:00:00,123 stdout F not a CRI time",
    ],
)
def test_lookalikes_are_not_prefixes(line: str) -> None:
    batch = frame(f"{line}\n".encode())
    assert batch.lines == [line]
    assert (batch.ranks, batch.local_ranks, batch.tasks, batch.ts) == (None, None, None, None)


def test_cri_header_stripped_and_time_kept() -> None:
    data = (
        b"2024-05-01T10:00:00.123456789Z stdout F Epoch 1 step 200\n"
        b'2024-05-01T10:00:01Z stderr F   File "train.py", line 7\n'
        b"2024-05-01T12:00:02.5+02:00 stdout F\n"
    )
    batch = frame(data)
    assert batch.lines == ["Epoch 1 step 200", '  File "train.py", line 7', ""]
    assert batch.ts == [
        ns("2024-05-01T10:00:00+00:00") + 123_456_789,
        ns("2024-05-01T10:00:01+00:00"),
        ns("2024-05-01T10:00:02.5+00:00"),
    ]
    # Offsets still count the raw records, headers included.
    assert batch.ends[-1] == len(data)


def test_cri_partial_records_are_joined() -> None:
    data = (
        b"2024-05-01T10:00:00.1Z stdout P RuntimeError: CUDA error: an illegal \n"
        b"2024-05-01T10:00:00.2Z stdout P memory access \n"
        b"2024-05-01T10:00:00.3Z stdout F was encountered\n"
        b"2024-05-01T10:00:00.4Z stdout F next\n"
    )
    batch = frame(data)
    assert batch.lines == [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "next",
    ]
    first_record_ts = ns("2024-05-01T10:00:00.1+00:00")
    assert batch.ts == [first_record_ts, first_record_ts + 300_000_000]
    assert batch.ends == [data.index(b"2024-05-01T10:00:00.4Z"), len(data)]


def test_cri_partial_waits_across_feeds_and_resume_offset_stays_before_it() -> None:
    framer = Framer()
    first = framer.feed(b"2024-05-01T10:00:00Z stdout F done\n2024-05-01T10:00:01Z stdout P hal")
    assert first.lines == ["done"]
    second = framer.feed(b"f \n")
    assert second.lines == []
    # A client resending from here must resend the partial record too.
    assert framer.offset == first.ends[0]
    third = framer.feed(b"2024-05-01T10:00:02Z stdout F and half\n")
    assert third.lines == ["half and half"]
    assert third.first_line_no == 2
    assert third.stream_offset == first.ends[0]


def test_cri_interleaved_streams_join_per_stream() -> None:
    data = (
        b"2024-05-01T10:00:00Z stdout P out-a \n"
        b"2024-05-01T10:00:00Z stderr P err-a \n"
        b"2024-05-01T10:00:01Z stderr F err-b\n"
        b"2024-05-01T10:00:01Z stdout F out-b\n"
    )
    assert frame(data).lines == ["err-a err-b", "out-a out-b"]


def test_cri_partial_never_completed_is_flushed_on_close() -> None:
    framer = Framer()
    framer.feed(b"2024-05-01T10:00:00Z stdout P killed mid-li")
    framer.feed(b"ne\n")
    last = framer.close()
    assert last.lines == ["killed mid-line"]
    assert last.ends == [len(b"2024-05-01T10:00:00Z stdout P killed mid-line\n")]
    assert last.ts == [ns("2024-05-01T10:00:00+00:00")]


def test_cri_joined_line_over_the_limit_is_truncated() -> None:
    record = b"2024-05-01T10:00:00Z stdout P " + b"a" * 30 + b"\n"
    data = record * 5 + b"2024-05-01T10:00:00Z stdout F end\n"
    framer = Framer(max_line_bytes=64)
    batch = framer.feed(data)
    assert batch.lines == ["a" * 64 + " …[truncated 89 bytes]"]
    assert batch.truncated == framer.truncated_lines == 1


def test_cri_with_launcher_prefix_inside() -> None:
    data = f"2024-05-01T10:00:00.5Z stderr F {NCCL_TIMEOUT}\n".encode()
    batch = frame(data)
    assert batch.lines == [NCCL_TIMEOUT]
    assert batch.ranks == [3]
    assert batch.ts == [ns("2024-05-01T10:00:00.5+00:00")]


def test_non_cri_lines_in_a_cri_stream_pass_through() -> None:
    data = b"2024-05-01T10:00:00Z stdout F in record\nstray line\n"
    batch = frame(data)
    assert batch.lines == ["in record", "stray line"]
    assert batch.ts == [ns("2024-05-01T10:00:00+00:00"), None]


def test_cri_time_that_is_no_date_keeps_the_line() -> None:
    batch = frame(b"2024-13-45T10:00:00Z stdout F odd clock\n")
    assert batch.lines == ["odd clock"]
    assert batch.ts == [None]


def test_prefix_state_does_not_leak_between_batches() -> None:
    framer = Framer()
    assert framer.feed(b"[rank1]:a\n").ranks == [1]
    assert framer.feed(b"b\n").ranks is None


def test_prefix_of_a_very_long_line_is_still_read() -> None:
    batch = frame(b"[rank5]:" + b"x" * 5000 + b"\n" + b"7: " + b"y" * 5000 + b"\n")
    assert batch.ranks == [5, 7]
    assert batch.tasks == [None, 7]


def test_role_names_up_to_sixteen_letters() -> None:
    batch = frame(b"[data_loader_role3]:ok\n[a_role_name_too_long_here1]:not read\n")
    assert batch.local_ranks == [3, None]


_PREFIXES = [
    "[rank7]:",
    "[trainer2]:",
    "3: ",
    " 11: [default0]:",
    " " * 8 + "12345678: ",
    "[" + "r" * 16 + "1234567]:",
    "[rank1234567]:",
    "12:",
]
_prefixes = st.sampled_from(["", "[INFO] ", "2024-05-01 10:00:00 ", "text ", *_PREFIXES])
_bodies = st.text(st.characters(exclude_characters="\n\r\x00\x1b", codec="utf-8"), max_size=60)


def _assert_as_parsed_line_by_line(lines: list[str]) -> None:
    batch = frame("".join(line + "\n" for line in lines).encode())
    # The parser run on every line, with none of the framer's chunk-level shortcuts.
    expected = LauncherPrefixes().parse(line_heads(batch.lines))
    if expected is None:
        assert (batch.ranks, batch.local_ranks, batch.tasks) == (None, None, None)
    else:
        assert batch.ranks == expected.ranks
        assert batch.local_ranks == expected.local_ranks
        assert batch.tasks == expected.tasks


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ("[rank7]:payload", "ranks", 7),
        ("[trainer2]:payload", "local_ranks", 2),
        ("3: payload", "tasks", 3),
        (" 11: [default0]:payload", "local_ranks", 0),
        (" " * 8 + "12345678: payload", "tasks", 12345678),
        ("[" + "r" * 16 + "1234567]:payload", "local_ranks", 1234567),
        ("[rank1234567]:payload", "ranks", 1234567),
        ("12:", "tasks", 12),
    ],
)
@pytest.mark.parametrize("position", [0, 2])
def test_each_prefix_alone_in_a_chunk_is_found(
    line: str, field: str, value: int, position: int
) -> None:
    lines = ["INFO: starting", "hello world", "done"]
    lines.insert(position, line)
    _assert_as_parsed_line_by_line(lines)
    assert getattr(frame("\n".join(lines).encode()), field)[position] == value


@given(lines=st.lists(st.tuples(_prefixes, _bodies).map("".join), min_size=1, max_size=20))
def test_cheap_chunk_checks_never_hide_a_prefix(lines: list[str]) -> None:
    _assert_as_parsed_line_by_line(lines)
