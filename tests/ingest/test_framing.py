"""Framing of raw byte streams: chunk boundaries, dirty bytes, long lines, offsets."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnoser.ingest.framing import Framer, LineBatch, frame


def feed_all(
    chunks: Iterable[bytes], framer: Framer | None = None, *, close: bool = True
) -> tuple[list[str], list[int], list[LineBatch]]:
    """Feed `chunks` (then close) and return all lines, all ends and the batches."""
    framer = framer or Framer()
    batches = [framer.feed(chunk) for chunk in chunks]
    if close:
        batches.append(framer.close())
    lines = [line for batch in batches for line in batch.lines]
    ends = [end for batch in batches for end in batch.ends]
    return lines, ends, batches


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_lines_ends_and_numbers_across_feeds() -> None:
    framer = Framer()
    first = framer.feed(b"alpha\nbeta\ngam")
    second = framer.feed(b"ma\ndelta\n")

    assert (first.stream_offset, first.first_line_no) == (0, 1)
    assert first.lines == ["alpha", "beta"]
    assert first.ends == [6, 11]
    assert (second.stream_offset, second.first_line_no) == (11, 3)
    assert second.lines == ["gamma", "delta"]
    assert second.ends == [17, 23]
    assert [second.start_of(i) for i in range(2)] == [11, 17]
    assert (framer.offset, framer.line_no) == (23, 5)


def test_empty_lines_are_lines() -> None:
    lines, ends, _ = feed_all([b"\n\na\n\n"])
    assert lines == ["", "", "a", ""]
    assert ends == [1, 2, 4, 5]


@pytest.mark.parametrize("cut", range(1, 9))
def test_crlf_split_anywhere_is_stripped_but_counted(cut: int) -> None:
    data = b"one\r\ntwo\r\n"
    lines, ends, _ = feed_all([data[:cut], data[cut:]])
    assert lines == ["one", "two"]
    assert ends == [5, 10]


def test_lone_carriage_return_stays_in_the_text() -> None:
    lines, _, _ = feed_all([b"10%\r50%\r100%\r\n"])
    assert lines == ["10%\r50%\r100%"]


@pytest.mark.parametrize("text", ["é", "日本語", "🔥 GPU", "Ünïcødé ✓"])
def test_multibyte_character_split_at_every_byte(text: str) -> None:
    data = f"x {text} y\n".encode()
    for cut in range(1, len(data)):
        lines, ends, _ = feed_all([data[:cut], data[cut:]])
        assert lines == [f"x {text} y"], cut
        assert ends == [len(data)]


def test_one_byte_at_a_time() -> None:
    data = "naïve\r\n\x1b[1mbold\x1b[0m\n🔥\n".encode()
    lines, ends, _ = feed_all(split_every(data, 1))
    assert lines == ["naïve", "bold", "🔥"]
    assert ends == [8, 21, 26]


def test_invalid_utf8_is_replaced_and_offsets_stay_exact() -> None:
    data = b"ok \xff\xfe bad\n\xc3(\n\xe2\x82\n"
    lines, ends, _ = feed_all([data])
    assert lines == ["ok \ufffd\ufffd bad", "\ufffd(", "\ufffd"]
    assert ends == [10, 13, 16]


def test_nul_bytes_removed() -> None:
    lines, ends, _ = feed_all([b"\x00\x00ab\x00c\n"])
    assert lines == ["abc"]
    assert ends == [7]


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"\x1b[31mERROR\x1b[0m: boom", "ERROR: boom"),
        (b"\x1b[1;38;5;196mred\x1b[m", "red"),
        (b"\x1b[2K\x1b[1Gprogress", "progress"),
        (b"\x1b]8;;https://x.io\x07link\x1b]8;;\x07", "link"),
        (b"\x1b]0;title\x1b\\body", "body"),
        (b"\x1b(Bplain\x1b=", "plain"),
        (b"cut off \x1b[38;5", "cut off "),
    ],
)
def test_ansi_escapes_removed(raw: bytes, text: str) -> None:
    lines, ends, _ = feed_all([raw + b"\n"])
    assert lines == [text]
    assert ends == [len(raw) + 1]


def test_ansi_sequence_split_across_chunks() -> None:
    lines, _, _ = feed_all([b"\x1b[3", b"1mred\x1b", b"[0m\n"])
    assert lines == ["red"]


def test_escape_does_not_swallow_the_next_line() -> None:
    lines, _, _ = feed_all([b"a\x1b[\nb\x1b]title\nc\n"])
    assert lines == ["a", "b", "c"]


def test_long_line_truncated_with_marker_and_counted() -> None:
    framer = Framer(max_line_bytes=10)
    batch = framer.feed(b"short\n" + b"x" * 25 + b"\nafter\n")

    assert batch.lines == ["short", "x" * 10 + " …[truncated 15 bytes]", "after"]
    assert batch.ends == [6, 32, 38]
    assert batch.truncated == 1
    assert framer.truncated_lines == 1


def test_line_at_the_limit_is_kept_whole_even_with_crlf() -> None:
    batch = frame(b"x" * 10 + b"\r\n" + b"y" * 10 + b"\n", max_line_bytes=10)
    assert batch.lines == ["x" * 10, "y" * 10]
    assert batch.truncated == 0


def test_truncation_does_not_split_a_character() -> None:
    # "é" is two bytes; the limit falls between them.
    batch = frame("aaaé€tail\n".encode(), max_line_bytes=4)
    assert batch.lines == ["aaa …[truncated 9 bytes]"]


def test_held_partial_line_is_bounded_and_flushed_by_close() -> None:
    limit = 1024
    chunk = b"z" * 65536
    framer = Framer(max_line_bytes=limit)
    tracemalloc.start()
    try:
        for _ in range(160):  # 10 MiB without a newline
            assert framer.feed(chunk).lines == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024
    assert framer.pending_bytes == 160 * 65536

    last = framer.close()
    assert last.lines == ["z" * limit + f" …[truncated {160 * 65536 - limit} bytes]"]
    assert last.ends == [160 * 65536]
    assert framer.truncated_lines == 1


def test_overflowing_partial_completed_by_a_later_chunk() -> None:
    framer = Framer(max_line_bytes=8)
    lines, ends, _ = feed_all([b"ok\nAAAA", b"BBBBBBBB", b"CC\r", b"\nnext\n"], framer)
    assert lines == ["ok", "AAAABBBB …[truncated 6 bytes]", "next"]
    assert ends == [3, 19, 24]
    assert framer.truncated_lines == 1


def test_empty_chunks_change_nothing() -> None:
    framer = Framer(stream_offset=100, line_no=7)
    assert framer.feed(b"") == LineBatch(100, 7, [], [])
    framer.feed(b"par")
    empty = framer.feed(b"")
    assert (empty.stream_offset, empty.first_line_no, empty.lines) == (100, 7, [])
    assert framer.feed(b"tial\n").lines == ["partial"]


def test_close_flushes_an_unterminated_line() -> None:
    framer = Framer()
    framer.feed(b"done\nlast words\r")
    batch = framer.close()
    assert batch.lines == ["last words"]
    assert batch.ends == [16]
    assert batch.first_line_no == 2


def test_close_without_partial_is_empty_and_idempotent() -> None:
    framer = Framer()
    framer.feed(b"a\n")
    assert framer.close() == LineBatch(2, 2, [], [])
    assert framer.close() == LineBatch(2, 2, [], [])
    with pytest.raises(ValueError, match="closed"):
        framer.feed(b"more\n")


def test_resumed_framer_continues_offsets_and_numbers() -> None:
    data = "".join(f"line {i} ünï\r\n" for i in range(50)).encode()
    whole = frame(data)
    resume_at = 20
    offset = whole.ends[resume_at - 1]

    framer = Framer(stream_offset=offset, line_no=resume_at + 1)
    lines, ends, batches = feed_all(split_every(data[offset:], 37), framer)

    assert lines == whole.lines[resume_at:]
    assert ends == whole.ends[resume_at:]
    assert batches[0].stream_offset == offset
    assert batches[0].first_line_no == resume_at + 1
    assert framer.line_no == 51


def test_batches_tile_the_stream() -> None:
    data = b"".join(b"%d %s\n" % (i, b"x" * (i % 13)) for i in range(500))
    _, ends, batches = feed_all(split_every(data, 101))
    assert ends[-1] == len(data)
    non_empty = [b for b in batches if b.lines]
    for before, after in pairwise(non_empty):
        assert after.stream_offset == before.ends[-1]
        assert after.first_line_no == before.first_line_no + len(before.lines)


def test_invalid_arguments_rejected() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        Framer(max_line_bytes=0)
    with pytest.raises(ValueError, match="line_no"):
        Framer(line_no=0)


# Fragments that exercise every path; hypothesis mixes them with arbitrary bytes.
_FRAGMENTS = [
    b"\n",
    b"\r",
    b"\r\n",
    b"\x00",
    b"\x1b",
    b"\x1b[31m",
    b"\x1b]0;t\x07",
    b"\xc3\xa9",
    b"\xc3",
    b"\xa9",
    b"\xe6\x97\xa5",
    b"\xf0\x9f\x94\xa5",
    b"\xff",
    b"word",
    b" ",
    b"[rank3]:",
    b"[default1]:",
    b"2: ",
    b"2024-05-01T10:00:00.5Z stdout F ",
    b"2024-05-01T10:00:01Z stderr P ",
    b"2024-05-01T10:00:02+01:00 stdout P ",
]
_soup = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.binary(max_size=12)), max_size=40).map(
    b"".join
)
# Whole records, so that partial CRI records meet the records completing them across splits.
_record = st.tuples(
    st.sampled_from([b"", b"2024-05-01T10:00:0", b"2024-05-01T10:00:00.25Z stdout "]),
    st.sampled_from([b"", b"1Z stdout P ", b"2Z stdout F ", b"3Z stderr P ", b"4Z stderr F "]),
    st.sampled_from([b"", b"[rank7]:", b"[trainer2]:", b"3: ", b" 11: [default0]:"]),
    st.binary(max_size=6),
    st.sampled_from([b"\n", b"\r\n"]),
).map(b"".join)
_streams = st.one_of(_soup, st.lists(_record, max_size=12).map(b"".join))


@st.composite
def _split(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    data = draw(_streams)
    points = sorted(draw(st.lists(st.integers(0, len(data)), max_size=10)))
    bounds = [0, *points, len(data)]
    return data, [data[a:b] for a, b in pairwise(bounds)]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(case=_split(), limit=st.integers(1, 48))
def test_any_split_frames_like_the_whole(case: tuple[bytes, list[bytes]], limit: int) -> None:
    data, chunks = case
    whole = frame(data, max_line_bytes=limit)
    framer = Framer(max_line_bytes=limit)
    batches = [framer.feed(chunk) for chunk in chunks] + [framer.close()]

    def column(name: str) -> list[int | None]:
        values: list[int | None] = []
        for batch in batches:
            got = getattr(batch, name)
            values += got if got is not None else [None] * len(batch.lines)
        return values

    assert [line for b in batches for line in b.lines] == whole.lines
    assert [end for b in batches for end in b.ends] == whole.ends
    for name in ("ranks", "local_ranks", "tasks", "ts"):
        expected = getattr(whole, name)
        assert column(name) == (expected or [None] * len(whole.lines))
    assert framer.truncated_lines == whole.truncated
    assert framer.offset == (whole.ends[-1] if whole.ends else 0)
    if whole.ends:
        assert whole.ends[-1] == len(data)


def _reference(data: bytes, limit: int) -> tuple[list[str], list[int]]:
    """Line by line, the obvious way: what the chunk-level code must agree with."""
    lines: list[str] = []
    ends: list[int] = []
    raw_lines = data.split(b"\n")
    terminated = [True] * (len(raw_lines) - 1) + [False]
    if raw_lines[-1] == b"":
        raw_lines.pop()
        terminated.pop()
    offset = 0
    for raw, has_newline in zip(raw_lines, terminated, strict=True):
        offset += len(raw) + has_newline
        content = raw[:-1] if raw.endswith(b"\r") else raw
        marker = ""
        if len(content) > limit:
            cut = limit
            while cut > limit - 3 and cut and 0x80 <= content[cut] < 0xC0:
                cut -= 1
            marker = f" …[truncated {len(content) - cut} bytes]"
            content = content[:cut]
        content = content.replace(b"\x00", b"")
        text = content.decode("utf-8", "replace")
        lines.append(text + marker)
        ends.append(offset)
    return lines, ends


_plain_fragments = [f for f in _FRAGMENTS if b"\x1b" not in f and not f.startswith(b"2")]


@settings(max_examples=300)
@given(
    data=st.lists(
        st.one_of(st.sampled_from(_plain_fragments), st.binary(max_size=8)), max_size=30
    ).map(lambda parts: b"".join(parts).replace(b"\x1b", b"")),
    limit=st.integers(1, 40),
    size=st.integers(1, 17),
)
def test_agrees_with_line_by_line_reference(data: bytes, limit: int, size: int) -> None:
    lines, ends, _ = feed_all(split_every(data, size), Framer(max_line_bytes=limit))
    assert (lines, ends) == _reference(data, limit)
