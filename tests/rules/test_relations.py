"""Declared relations: a surviving rank's timeout is a symptom; Xid 154 overrides its companion."""

from __future__ import annotations

from diagnoser.rules import RuleSet, make_batch, relate

TIMEOUT = "[rank7]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out."  # noqa: E501


def test_timeout_is_a_symptom_of_another_nodes_hardware_fault(pack: RuleSet) -> None:
    scanner = pack.job_scanner()
    events = scanner.feed("node-1", 7, make_batch([TIMEOUT]), 10.0)
    events += scanner.feed(
        "node-2",
        None,
        make_batch(["NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."]),
        5.0,
    )
    relations = relate(events, pack)
    assert relations.symptom_of == {0: 1}
    assert events[1].node == "node-2"


def test_timeout_alone_is_not_a_symptom(pack: RuleSet) -> None:
    events = pack.job_scanner().feed("node-1", 7, make_batch([TIMEOUT]), 10.0)
    assert relate(events, pack).symptom_of == {}


def test_xid_154_overrides_companion_on_same_gpu_only(pack: RuleSet) -> None:
    lines = [
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:02:00): 48, pid=1, An uncorrectable double bit error",
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",  # noqa: E501
    ]
    events = pack.job_scanner().feed("node-1", None, make_batch(lines), 0.0)
    assert [e.rule_id for e in events] == [
        "xid_fallen_off_bus",
        "xid_ecc_uncorrectable",
        "xid_recovery_action",
    ]
    assert relate(events, pack).overridden_by == {0: 2}
