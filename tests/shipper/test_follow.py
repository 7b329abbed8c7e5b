"""The file follower and the pipe reader: pure I/O on real files and pipes, no HTTP."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnoser.shipper.follow import FileFollower, NotARegularFileError, whole_lines
from diagnoser.shipper.pipe import PipeReader


def drain(source: FileFollower | PipeReader, size: int = 64 * 1024) -> bytes:
    out = bytearray()
    while chunk := source.read(size):
        out += chunk
    return bytes(out)


@pytest.fixture
def notes() -> list[str]:
    return []


@pytest.fixture
def follower(tmp_path: Path, notes: list[str]) -> Iterator[FileFollower]:
    source = FileFollower(tmp_path / "train.log", follow=True, notify=notes.append)
    yield source
    source.close()


def test_without_follow_reads_to_the_end_partial_line_included(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"one\ntwo\nthree")
    source = FileFollower(path, follow=False)
    source.start(0)
    assert not source.exhausted
    assert drain(source, size=5) == b"one\ntwo\nthree"
    assert source.exhausted
    assert source.offset == 13
    source.close()


def test_missing_file_without_follow_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileFollower(tmp_path / "nope.log", follow=False).start(0)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotARegularFileError):
        FileFollower(tmp_path, follow=False).start(0)


def test_start_resumes_at_the_committed_offset_when_the_file_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"one\ntwo\nthree\n")
    source = FileFollower(path, follow=False)
    source.start(4)
    assert source.offset == 4
    assert drain(source) == b"two\nthree\n"
    assert source.offset == 14
    source.close()


def test_start_takes_a_shorter_file_as_new_and_continues_the_offset(tmp_path: Path) -> None:
    notes: list[str] = []
    path = tmp_path / "a.log"
    path.write_bytes(b"new\n")
    source = FileFollower(path, follow=False, notify=notes.append)
    source.start(100)
    assert source.offset == 100
    assert drain(source) == b"new\n"
    assert source.offset == 104
    assert "taking it as a new file" in notes[0]
    source.close()


def test_following_hands_out_whole_lines_as_they_are_appended(
    follower: FileFollower,
) -> None:
    path = follower.path
    path.write_bytes(b"")
    follower.start(0)
    assert follower.read() == b""
    with path.open("ab") as log:
        log.write(b"step 1\nstep ")
        log.flush()
        assert follower.read() == b"step 1\n"
        assert follower.read() == b""  # "step " waits for its newline
        log.write(b"2\nstep 3\n")
        log.flush()
        assert drain(follower) == b"step 2\nstep 3\n"
    assert follower.offset == path.stat().st_size


def test_a_line_longer_than_a_read_is_not_held_back(follower: FileFollower) -> None:
    follower.path.write_bytes(b"x" * 100)
    follower.start(0)
    assert follower.read(10) == b"x" * 10


def test_rotation_finishes_the_old_file_then_follows_the_new_one(
    follower: FileFollower, notes: list[str]
) -> None:
    path = follower.path
    path.write_bytes(b"old 1\n")
    follower.start(0)
    assert drain(follower) == b"old 1\n"
    with path.open("ab") as log:
        log.write(b"old 2\n")  # written after the last read, before rotation is noticed
    path.rename(path.with_suffix(".log.1"))
    path.write_bytes(b"new 1\n")
    assert drain(follower) == b"old 2\nnew 1\n"
    assert follower.offset == 18
    assert any("rotated" in note for note in notes)
    with path.open("ab") as log:
        log.write(b"new 2\n")
    assert drain(follower) == b"new 2\n"
    assert follower.offset == 24


def test_the_rotated_file_stays_readable_until_released(follower: FileFollower) -> None:
    path = follower.path
    path.write_bytes(b"old 1\nold 2\n")
    follower.start(0)
    drain(follower)
    path.rename(path.with_suffix(".log.1"))
    path.write_bytes(b"new 1\n")
    assert drain(follower) == b"new 1\n"
    path.with_suffix(".log.1").unlink()  # even deleted: the open file still has the bytes
    follower.seek(6)
    assert drain(follower) == b"old 2\nnew 1\n"
    follower.release(12)
    follower.seek(12)
    assert drain(follower) == b"new 1\n"
    follower.seek(6)  # released: those bytes are gone, the next ones take their offset
    assert drain(follower) == b"new 1\n"
    assert follower.offset == 12


def test_truncation_restarts_at_position_zero_and_the_offset_keeps_growing(
    follower: FileFollower, notes: list[str]
) -> None:
    path = follower.path
    path.write_bytes(b"before 1\nbefore 2\n")
    follower.start(0)
    assert drain(follower) == b"before 1\nbefore 2\n"
    path.write_bytes(b"after\n")  # opened with O_TRUNC, like copytruncate
    assert drain(follower) == b"after\n"
    assert follower.offset == 18 + 6
    assert any("truncated" in note for note in notes)


def test_seeking_into_bytes_lost_to_truncation_skips_them(
    follower: FileFollower, notes: list[str]
) -> None:
    path = follower.path
    path.write_bytes(b"lost 1\nlost 2\n")
    follower.start(0)
    drain(follower)
    path.write_bytes(b"kept\n")
    drain(follower)
    follower.seek(7)  # the server committed only "lost 1\n"
    assert follower.offset == 7
    assert drain(follower) == b"kept\n"
    assert follower.offset == 12
    assert any("lost" in note for note in notes)


def test_a_path_missing_at_start_is_waited_for_and_read_from_its_start(
    follower: FileFollower,
) -> None:
    follower.start(50)
    assert follower.read() == b""
    assert follower.offset == 50
    follower.path.write_bytes(b"hello\n")
    assert drain(follower) == b"hello\n"
    assert follower.offset == 56


def test_a_removed_path_keeps_the_open_file_until_a_new_one_appears(
    follower: FileFollower,
) -> None:
    path = follower.path
    path.write_bytes(b"a\n")
    follower.start(0)
    drain(follower)
    with path.open("ab") as log:
        path.unlink()
        log.write(b"b\n")
        log.flush()
        assert drain(follower) == b"b\n"
    path.write_bytes(b"c\n")
    assert drain(follower) == b"c\n"
    assert follower.offset == 6


def test_whole_lines() -> None:
    assert whole_lines(b"a\nb", 10) == b"a\n"
    assert whole_lines(b"a\n", 10) == b"a\n"
    assert whole_lines(b"abc", 10) == b""
    assert whole_lines(b"abc", 3) == b"abc"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["write", "rotate", "read"]), st.binary(max_size=40)),
        max_size=25,
    )
)
def test_every_byte_written_is_read_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, bytes]]
) -> None:
    """Whatever the interleaving of appends, rotations and reads, the stream is the
    concatenation of every file's content, with offsets that match."""
    directory = tmp_path_factory.mktemp("prop")
    path = directory / "p.log"
    path.write_bytes(b"")
    source = FileFollower(path, follow=True)
    source.start(0)
    written, read = bytearray(), bytearray()
    rotations = 0
    for action, data in steps:
        if action == "write":
            with path.open("ab") as log:
                log.write(data)
            written += data
        elif action == "rotate":
            rotations += 1
            path.rename(directory / f"p.log.{rotations}")
            path.write_bytes(b"")
        read += drain(source, size=16)
    with path.open("ab") as log:
        log.write(b"\n")  # completes a partial last line, so that it is handed out
    written += b"\n"
    read += drain(source, size=16)
    assert bytes(read) == bytes(written)
    assert source.offset == len(written)
    source.close()


def test_pipe_reader_buffers_until_released_and_resends_from_there() -> None:
    read_fd, write_fd = os.pipe()
    try:
        source = PipeReader(read_fd)
        source.start(1000)
        os.write(write_fd, b"one\ntwo\nthr")
        assert drain(source) == b"one\ntwo\n"
        assert source.offset == 1008
        source.seek(1004)
        assert drain(source) == b"two\n"
        source.release(1004)
        source.seek(1000)  # no longer buffered: the buffered bytes continue at 1000
        assert drain(source) == b"two\n"
        source.seek(1004)
        os.write(write_fd, b"ee")
        os.close(write_fd)
        write_fd = -1
        assert drain(source) == b"three"  # at the pipe's end the partial line goes too
        assert source.exhausted
        assert source.offset == 1009
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
