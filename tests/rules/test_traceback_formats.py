"""Traceback spellings seen in real training logs, beyond the plain CPython one."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet, load_dir, scan_lines

PACK = Path(__file__).resolve().parents[2] / "rules"


@pytest.fixture(scope="module")
def pack() -> RuleSet:
    return load_dir(PACK)


def test_a_module_qualified_lower_case_exception_closes_the_traceback(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.10/socket.py", line 955, in getaddrinfo',
            "    for res in _socket.getaddrinfo(host, port, family, type, proto, flags):",
            "socket.gaierror: [Errno -2] Name or service not known",
        ],
    )
    assert [e.entities.get("exception") for e in events] == ["gaierror"]


def test_rich_boxed_tracebacks_are_assembled(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "╭───────────────────── Traceback (most recent call last) ─────────────────────╮",
            "│ /workspace/train.py:91 in train_step                                         │",
            "│                                                                              │",
            "│    90 │   │   │   │   labels = batch['labels']                               │",
            "│ ❱  91 │   │   │   │   mask = batch['attention_mask']                         │",
            "╰──────────────────────────────────────────────────────────────────────────────╯",
            "KeyError: 'attention_mask'",
        ],
    )
    assert [(e.failure_type, e.action.value) for e in events] == [("KeyError", "notify_user")]
    assert any("train.py:91" in line for line in events[0].evidence)


def test_an_exception_line_whose_header_was_cut_off_still_classifies(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "│ ❱  88 │   │   p_mask = batch['attention_mask']                          │",
            "╰──────────────────────────────────────────────────────────────────────────╯",
            "KeyError: 'attention_mask'",
        ],
    )
    assert [(e.failure_type, e.action.value) for e in events] == [("KeyError", "notify_user")]
    assert events[0].entities["headless"] == "true"


def test_a_headless_runtime_error_goes_to_the_specific_rule(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "output += torch.matmul(subA, state.subB)",
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (511x2 and 3x4096)",
        ],
    )
    assert [e.rule_id for e in events] == ["python_shape_mismatch"]


@pytest.mark.parametrize(
    ("line", "failure_type", "action"),
    [
        ("[rank3]: ValueError: tokenizer has no pad token", "ValueError", "notify_user"),
        ("transformers.tokenization_utils.ImportError: no module", "ImportError", "notify_user"),
    ],
)
def test_headless_spellings(pack: RuleSet, line: str, failure_type: str, action: str) -> None:
    assert [(e.failure_type, e.action.value) for e in scan_lines(pack, [line])] == [
        (failure_type, action)
    ]


def test_a_complete_traceback_yields_one_event_not_a_second_headless_one(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "Traceback (most recent call last):",
            '  File "/workspace/train.py", line 171, in main',
            '    label = sample["labels"]',
            "KeyError: 'labels'",
        ],
    )
    assert len(events) == 1
    assert "headless" not in events[0].entities
    assert any("train.py" in line for line in events[0].evidence)


@pytest.mark.parametrize(
    "line",
    [
        "[WARNING] skipped sample 17 after KeyError: 'labels'",
        "    ValueError: raised inside a docstring or an indented report",
        "wandb: ERROR Error: api key not configured (retrying)",
        "Error: the server returned 503, retrying in 5 s",
        # Headless, a type no specific rule names is not enough: healthy runs print these.
        "MeanSquaredError: 0.0123",
        "ConnectionError: retrying in 5s",
    ],
)
def test_exceptions_named_inside_other_text_are_not_failures(pack: RuleSet, line: str) -> None:
    assert scan_lines(pack, [line]) == []


@pytest.mark.parametrize(
    "line", ["Exception: evaluation dataset is empty", "java.io.IOException: Broken pipe"]
)
def test_a_headless_exception_of_an_unknown_type_escalates(pack: RuleSet, line: str) -> None:
    """Never silent on a failing log (rules/escalation.yaml): an uncaught exception line at
    column 0 escalates when it does not say it is being retried or report a value."""
    (event,) = scan_lines(pack, [line])
    assert (event.rule_id, event.action) == ("unexplained_exception_line", Action.ESCALATE)
    assert event.entities["headless"] == "true"


def test_open_mpi_tagged_tracebacks_are_assembled(pack: RuleSet) -> None:
    """`mpirun --tag-output` (Horovod too) prefixes every line with `[job,rank]<stream>:`."""
    events = scan_lines(
        pack,
        [
            "[1,3]<stderr>:Traceback (most recent call last):",
            '[1,3]<stderr>:  File "/workspace/train.py", line 12, in <module>',
            "[1,3]<stderr>:    main()",
            "[1,3]<stderr>:KeyError: 'labels'",
        ],
    )
    assert [(e.failure_type, e.action.value) for e in events] == [("KeyError", "notify_user")]
