"""Scanner behaviour: multi-line assembly, windows, timeouts, actions stated by the line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from diagnoser.ingest.framing import LineBatch
from diagnoser.rules import Action, JobScanner, RuleSet, load_dir, make_batch, scan_lines
from diagnoser.rules.engine import parse_time
from tests.rules.conftest import MINIMAL_RULE, write_rules

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 212, in <module>',
    "    main()",
    '  File "/workspace/train.py", line 171, in main',
    '    label = sample["labels"]',
    "KeyError: 'labels'",
]


def test_traceback_split_across_batches(pack: RuleSet) -> None:
    scanner = pack.job_scanner()
    first = scanner.feed("node-1", 0, make_batch(TRACEBACK[:3]), now=100.0)
    assert first == []
    second = scanner.feed("node-1", 0, make_batch(TRACEBACK[3:], 200, 4), now=101.0)
    (event,) = second
    assert event.failure_type == "KeyError"
    assert event.action is Action.NOTIFY_USER
    assert event.line_no == 6
    assert event.evidence == tuple(TRACEBACK[:5])
    assert event.entities["last_frame"].startswith('File "/workspace/train.py", line 171')


def test_interleaved_ranks_assemble_per_rank(pack: RuleSet) -> None:
    other = [
        "Traceback (most recent call last):",
        '  File "/workspace/model.py", line 40, in forward',
        "AttributeError: 'NoneType' object has no attribute 'shape'",
    ]
    lines: list[str] = []
    ranks: list[int | None] = []
    for i in range(max(len(TRACEBACK), len(other))):
        for rank, source in ((0, TRACEBACK), (1, other)):
            if i < len(source):
                lines.append(source[i])
                ranks.append(rank)
    batch = make_batch(lines)
    batch = type(batch)(batch.stream_offset, batch.first_line_no, batch.lines, batch.ends, ranks)
    events = pack.job_scanner().feed("node-1", None, batch, now=0.0)
    by_rank = {e.rank: e for e in events}
    assert by_rank[0].failure_type == "KeyError"
    assert by_rank[1].failure_type == "AttributeError"
    assert all("model.py" not in line for line in by_rank[0].evidence)


def test_incomplete_traceback_escalates_its_frames_on_flush(pack: RuleSet) -> None:
    """The stream ends inside a traceback: no exception to classify, but its frames are no
    longer any unit's evidence, so the catch-all reads them (never a silent end)."""
    scanner = pack.job_scanner()
    assert scanner.feed("n", None, make_batch(TRACEBACK[:4]), 0.0) == []
    (event,) = scanner.flush("n", None, 0.0)
    assert (event.rule_id, event.action) == ("unexplained_traceback", Action.ESCALATE)
    assert event.text == TRACEBACK[1]


def test_traceback_frames_become_evidence_of_line_rule(pack: RuleSet) -> None:
    lines = [
        *TRACEBACK[:5],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB",  # noqa: E501
    ]
    (event,) = scan_lines(pack, lines)
    assert event.rule_id == "cuda_oom"
    assert event.entities["requested"] == "2.00 GiB"
    assert event.entities["gpu"] == "3"
    assert len(event.evidence) == 5


def test_child_failed_root_cause_is_parsed(pack: RuleSet) -> None:
    lines = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "[1]:",
        "  time      : 2026-02-18_10:00:05",
        "  host      : worker-9",
        "  rank      : 13 (local_rank: 5)",
        "  exitcode  : -9 (pid: 6000)",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-02-18_10:00:00",
        "  host      : worker-3",
        "  rank      : 11 (local_rank: 3)",
        "  exitcode  : -11 (pid: 5277) (SIGSEGV)",
        "  error_file: <N/A>",
        "  traceback : Signal 11 (SIGSEGV) received by PID 5277",
        "============================================================",
    ]
    (event,) = scan_lines(pack, lines, node="launcher")
    assert event.rule_id == "torchrun_root_cause_sigsegv"
    assert event.rank == 11
    expected = {
        "host": "worker-3", "rank": "11", "local_rank": "3", "exitcode": "-11",
        "pid": "5277", "signal": "SIGSEGV", "script": "train.py",
    }  # fmt: skip
    assert event.entities.items() >= expected.items()


def test_nccl_report_keeps_last_error(pack: RuleSet) -> None:
    lines = [
        "[rank7]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",  # noqa: E501
        "[rank7]: ncclUnhandledCudaError: Call to CUDA function failed.",
        "[rank7]: Last error:",
        "[rank7]: Cuda failure 2 'out of memory'",
        "[rank7]: step 12 done",
    ]
    events = scan_lines(pack, lines)
    assert [e.rule_id for e in events] == ["nccl_cuda_oom"]
    assert events[0].entities["last_error"] == "Cuda failure 2 'out of memory'"
    assert events[0].entities["nccl_version"] == "2.20.5"
    assert not any(e.failure_type == "cuda_oom" for e in events)


def test_watchdog_entities(pack: RuleSet) -> None:
    line = "[rank0]:[E1206 18:44:12.715588844 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752."  # noqa: E501
    (event,) = scan_lines(pack, [line])
    assert event.entities == {
        "rank": "0",
        "seq": "7753",
        "last_enqueued": "7755",
        "last_completed": "7752",
    }
    assert event.rank == 0


XID = "NVRM: Xid (PCI:{pci}): {xid}, pid=9811, Ch 00000010"


def test_app_xid_repeated_on_same_gpu_escalates_for_a_diagnostic(pack: RuleSet) -> None:
    """A hardware suspicion, not proof: NVSentinel runs a diagnostic; a person decides here."""
    scanner = pack.job_scanner()
    first = scanner.feed("node-4", None, make_batch([XID.format(pci="0000:3b:00", xid=31)]), 1000.0)
    assert {e.action for e in first} == {Action.RESTART_JOB}
    second = scanner.feed(
        "node-4", None, make_batch([XID.format(pci="0000:3b:00", xid=13)]), 1100.0
    )
    repeated = [e for e in second if e.rule_id == "xid_repeated_same_gpu"]
    assert [e.action for e in repeated] == [Action.ESCALATE]
    assert repeated[0].entities["window_count"] == "2"


def test_app_xid_on_different_gpus_stays_software(pack: RuleSet) -> None:
    scanner = pack.job_scanner()
    events = scanner.feed("node-4", None, make_batch([XID.format(pci="0000:3b:00", xid=31)]), 0.0)
    events += scanner.feed("node-4", None, make_batch([XID.format(pci="0000:86:00", xid=31)]), 1.0)
    events += scanner.feed("node-5", None, make_batch([XID.format(pci="0000:3b:00", xid=31)]), 2.0)
    assert {e.action for e in events} == {Action.RESTART_JOB}


def test_app_xid_outside_the_window_stays_software(pack: RuleSet) -> None:
    scanner = pack.job_scanner()
    events = scanner.feed("n", None, make_batch([XID.format(pci="0000:3b:00", xid=31)]), 0.0)
    events += scanner.feed(
        "n", None, make_batch([XID.format(pci="0000:3b:00", xid=31)]), 2 * 86400.0
    )
    assert all(e.action is Action.RESTART_JOB for e in events)


def test_window_uses_timestamps_in_lines(pack: RuleSet) -> None:
    lines = [
        "2025-01-01T00:00:00Z kernel: " + XID.format(pci="0000:3b:00", xid=13),
        "2025-01-03T00:00:00Z kernel: " + XID.format(pci="0000:3b:00", xid=13),
    ]
    assert not any(e.rule_id == "xid_repeated_same_gpu" for e in scan_lines(pack, lines))
    assert parse_time(lines[0]) == 1735689600.0


def test_xid_154_states_the_action(pack: RuleSet) -> None:
    (event,) = scan_lines(
        pack,
        [
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)"  # noqa: E501
        ],
    )
    assert event.action is Action.NONE
    (event,) = scan_lines(
        pack,
        [
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Something New)"  # noqa: E501
        ],
    )
    assert event.action is Action.ESCALATE


def test_unknown_xid_escalates_known_does_not_fall_back(pack: RuleSet) -> None:
    unknown = scan_lines(pack, [XID.format(pci="0000:0d:00", xid=51)])
    assert [(e.rule_id, e.entities["xid"]) for e in unknown] == [("xid_unknown", "51")]
    known = scan_lines(pack, [XID.format(pci="0000:0d:00", xid=48)])
    assert [e.rule_id for e in known] == ["xid_ecc_uncorrectable"]


def test_offsets_and_line_numbers(pack: RuleSet) -> None:
    lines = [
        "step 1",
        "step 2",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    batch = make_batch(lines, stream_offset=1000, first_line_no=41)
    (event,) = pack.job_scanner().feed("n", 2, batch, 5.0)
    assert (event.offset, event.line_no, event.rank, event.node, event.time) == (
        1014,
        43,
        2,
        "n",
        5.0,
    )


HOSTILE = MINIMAL_RULE.replace(
    "patterns: ['No space left on device']", "patterns: ['aaaa(a|aa)+b']"
).replace("match: ['OSError: [Errno 28] No space left on device']", "match: ['aaaaab']")


def test_catastrophic_pattern_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load-time check rejects this pattern (tests/rules/test_hostile_packs.py); one it
    missed still costs a line no more than the timeout."""
    monkeypatch.setattr("diagnoser.rules.ruleset.too_slow", lambda *_: False)
    write_rules(tmp_path, "hostile.yaml", HOSTILE)
    ruleset = load_dir(tmp_path, timeout=0.05)
    scanner = ruleset.job_scanner()
    started = time.perf_counter()
    events = scanner.feed("n", None, make_batch(["a" * 40 + "!", "aaaaab"]), 0.0)
    assert time.perf_counter() - started < 2.0
    assert scanner.timeouts == {"demo_disk_full": 1}
    assert [e.line_no for e in events] == [2]


def test_runtime_time_and_srun_prefixes(pack: RuleSet) -> None:
    lines = [
        "3: Traceback (most recent call last):",
        '3:   File "/workspace/train.py", line 9, in <module>',
        "3: ZeroDivisionError: division by zero",
    ]
    plain = make_batch(lines)
    batch = LineBatch(
        plain.stream_offset,
        plain.first_line_no,
        plain.lines,
        plain.ends,
        ranks=[3, 3, 3],
        ts=[None, None, 1_700_000_000_000_000_000],
    )
    (event,) = pack.job_scanner().feed("node-1", None, batch, now=5.0)
    assert (event.failure_type, event.rank) == ("ZeroDivisionError", 3)
    assert event.time == 1_700_000_000.0


@pytest.mark.parametrize(
    "prefix", ["", "[1,3]<stderr>:", "3: ", "[rank3]: ", "[default3]:", "(Worker pid=77) "]
)
def test_a_message_anchored_at_its_start_is_read_past_a_launcher_prefix(
    pack: RuleSet, prefix: str
) -> None:
    line = prefix + "RuntimeError: Socket Timeout"
    (event,) = scan_lines(pack, [line])
    assert (event.failure_type, event.action) == ("rendezvous_error", Action.RESTART_JOB)
    assert event.text == line


def test_a_warnings_backtrace_split_across_batches_is_still_the_warnings(pack: RuleSet) -> None:
    """Live streams arrive a few lines at a time: the warning, the backtrace's header and its
    frames may each come in a batch of their own, and the backtrace is still the warning's."""
    lines = [
        "[rank1]:[W901 07:40:19.968570826 TCPStore.cpp:125] [c10d] recvValue failed on "
        "SocketImpl(fd=64): failed to recv, got 0 bytes",
        "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:682 "
        "(most recent call first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f3c2a1b4e88 in "
        "/usr/lib/libc10.so)",
        "frame #1: <unknown function> + 0x5ba8afe (0x7f3c0e5a8afe in /usr/lib/libtorch_cpu.so)",
    ]
    scanner = JobScanner(pack)
    events = []
    offset = 0
    for no, line in enumerate(lines, 1):
        events += scanner.feed("n", None, make_batch([line], offset, no), 0.0)
        offset += len(line) + 1
    events += scanner.flush_all(0.0)
    assert [e.rule_id for e in events if e.rule_id == "unexplained_traceback"] == []
    alone = JobScanner(pack)
    orphan = alone.feed("n", None, make_batch(lines[1:]), 0.0) + alone.flush_all(0.0)
    assert "unexplained_traceback" in [e.rule_id for e in orphan]


CHILD_FAILED_PACK = """\
family: demo
description: a catch-all that reads a ChildFailedError header, and the report's own rule
rules:
  - id: demo_header
    description: the header of a report
    failure_type: abnormal_exit
    category: framework
    severity: error
    scope: job
    action: escalate
    fallback: true
    patterns: ['ChildFailedError:\\s*$']
    examples:
      match: ['torch.distributed.elastic.multiprocessing.errors.ChildFailedError:']
      no_match: ['ChildFailedError was raised and handled']
  - id: demo_root_cause
    description: the report's first failure
    failure_type: worker_process_failed
    category: framework
    severity: warning
    scope: job
    action: escalate
    unit: child_failed
    patterns: ['exitcode=']
    examples:
      match:
        - |
          torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
          Root Cause (first observed failure):
          [0]:
            host      : worker-3
            exitcode  : 1 (pid: 5277)
          ============================================================
      no_match: ['train.py FAILED']
"""
CHILD_FAILED_HEADER = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def test_a_child_failed_header_is_its_reports_until_the_report_never_comes(
    tmp_path: Path,
) -> None:
    """The header of a complete report is that report's evidence, as a traceback's header is;
    a header whose "Root Cause" section never came (the stream ends, or a traceback opens
    instead) goes back to the catch-all line rules, so a cut report is never silent."""
    write_rules(tmp_path, "child.yaml", CHILD_FAILED_PACK)
    ruleset = load_dir(tmp_path)
    complete = [
        CHILD_FAILED_HEADER,
        "Root Cause (first observed failure):",
        "[0]:",
        "  host      : worker-3",
        "  exitcode  : 1 (pid: 5277)",
        "============================================================",
    ]
    assert [e.rule_id for e in scan_lines(ruleset, complete)] == ["demo_root_cause"]

    scanner = ruleset.job_scanner()
    assert scanner.feed("n", None, make_batch([CHILD_FAILED_HEADER, "=" * 60]), 0.0) == []
    (event,) = scanner.flush("n", None, 0.0)
    assert (event.rule_id, event.text) == ("demo_header", CHILD_FAILED_HEADER)

    cut = [CHILD_FAILED_HEADER, "train.py FAILED", "Traceback (most recent call last):"]
    events = ruleset.job_scanner().feed("n", None, make_batch(cut), 0.0)
    assert [(e.rule_id, e.text) for e in events] == [("demo_header", CHILD_FAILED_HEADER)]
