"""Payloads: redacted, bounded, and Slack text that log lines cannot turn into markup."""

from __future__ import annotations

import re
from typing import Any

from diagnoser.actions import payloads
from diagnoser.actions.notify_wire import NotifyTarget
from diagnoser.llm.redaction import Redactor
from tests.actions.samples import DIAGNOSIS_ID, notify_action

OPENAI_KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"


def build(public_url: str | None = "https://diag.example", **target: Any) -> payloads.Notice:
    action = notify_action(**target)
    return payloads.notice(
        action, NotifyTarget.model_validate(action.target), Redactor(), public_url
    )


def slack_texts(body: dict[str, object]) -> list[str]:
    """Every mrkdwn/plain_text string of a Slack message."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("text"), str):
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(body)
    return found


def test_generic_payload_carries_the_diagnosis_and_its_link() -> None:
    body = payloads.generic_payload(build())
    assert body["type"] == "diagnoser.notify"
    assert body["idempotency_key"] == f"notify:oncall:{DIAGNOSIS_ID}"
    d = body["diagnosis"]
    assert d["id"] == DIAGNOSIS_ID
    assert d["job_id"] == "llama-70b-run7"
    assert d["family"] == "llama-70b"
    assert (d["category"], d["failure_type"]) == ("hardware", "xid_79")
    assert d["action"] == "cordon_node_and_restart"
    assert d["culprit_nodes"] == ["node-3"]
    assert d["evidence"][0].startswith("[node-3] NVRM: Xid")
    assert d["link"] == f"https://diag.example/v1/diagnoses/{DIAGNOSIS_ID}"


def test_without_a_public_url_the_targets_own_link_is_used() -> None:
    n = build(public_url=None)
    assert n.link == f"http://diagnoser.local/v1/diagnoses/{DIAGNOSIS_ID}"
    assert build(public_url=None, diagnosis_url=None).link is None
    assert build(public_url=None, diagnosis_url="javascript:alert(1)").link is None


def test_secrets_are_redacted_from_every_field() -> None:
    n = build(
        message=f"export OPENAI_API_KEY={OPENAI_KEY}",
        summary="launcher printed password=hunter2hunter2",
        evidence=[f"Authorization: Bearer {OPENAI_KEY}", "user alice@example.com"],
    )
    for body in (
        payloads.generic_payload(n),
        payloads.slack_payload(n),
        payloads.pagerduty_payload(n, "R0UTINGKEY"),
    ):
        text = repr(body)
        assert OPENAI_KEY not in text
        assert "hunter2hunter2" not in text
        assert "alice@example.com" not in text
        assert "[REDACTED:" in text
    assert sum(n.redactions.values()) >= 4


def test_terminal_control_sequences_are_stripped() -> None:
    n = build(evidence=["\x1b[31mCUDA error\x1b[0m\x00 at\x07 step 5"])
    assert n.evidence == ("CUDA error  at  step 5",)


def test_evidence_and_texts_are_bounded() -> None:
    n = build(
        evidence=[f"line {i} " + "x" * 2000 for i in range(100)],
        summary="s" * 10_000,
        message="m" * 10_000,
        culprit_nodes=[f"node-{i}" for i in range(500)],
    )
    assert len(n.evidence) == payloads.MAX_EVIDENCE_LINES
    assert all(len(line) <= payloads.MAX_LINE_CHARS for line in n.evidence)
    assert len(n.summary) <= payloads.MAX_SUMMARY_CHARS
    assert len(n.culprit_nodes) == payloads.MAX_NODES

    slack = payloads.slack_payload(n)
    assert len(slack["text"]) <= payloads.SLACK_TEXT_CHARS
    assert len(slack["blocks"]) <= 50
    header = slack["blocks"][0]
    assert header["type"] == "header"
    assert len(header["text"]["text"]) <= payloads.SLACK_HEADER_CHARS
    for block in slack["blocks"]:
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= payloads.SLACK_TEXT_CHARS
        for f in block.get("fields", []):
            assert len(f["text"]) <= payloads.SLACK_FIELD_CHARS
        assert len(block.get("fields", [])) <= 10

    pd = payloads.pagerduty_payload(n, "R0UTINGKEY")
    assert len(pd["payload"]["summary"]) <= payloads.PAGERDUTY_SUMMARY_CHARS


def test_slack_text_cannot_mention_link_or_broadcast() -> None:
    hostile = "<!channel> <@U024BE7LH> <https://evil.example|click me> @here &amp; @everyone"
    n = build(message=hostile, summary=hostile, evidence=[hostile, "```", "``` *bold*"])
    texts = slack_texts(payloads.slack_payload(n))
    joined = "\n".join(texts)
    # The only `<...>` is the link the notifier itself built.
    assert re.findall(r"<[^>]*>", joined) == [
        f"<https://diag.example/v1/diagnoses/{DIAGNOSIS_ID}|Open the diagnosis>"
    ]
    assert "&lt;!channel&gt;" in joined
    assert "&amp;amp;" in joined
    assert not re.search(r"(?i)@(here|channel|everyone)\b", joined)
    evidence = next(t for t in texts if t.startswith("```"))
    assert evidence.count("```") == 2  # the fence the notifier opened and closed, nothing else


def test_slack_clip_never_cuts_an_entity() -> None:
    assert payloads.slack_clip("a" * 8 + "<<<<", 12) == "a" * 8 + payloads.ELLIPSIS
    assert payloads.slack_clip("a" * 4 + "<<<<", 12) == "a" * 4 + "&lt;" + payloads.ELLIPSIS


def test_pagerduty_event_v2_shape() -> None:
    body = payloads.pagerduty_payload(build(), "R0UTINGKEY")
    assert body["routing_key"] == "R0UTINGKEY"
    assert body["event_action"] == "trigger"
    assert body["dedup_key"] == f"notify:oncall:{DIAGNOSIS_ID}"
    p = body["payload"]
    assert (
        p["summary"]
        == "xid_79 in job llama-70b-run7 on node-3: Xid 79: GPU fell off the bus on node-3"
    )
    assert p["source"] == "node-3"
    assert p["severity"] == "critical"
    assert p["group"] == "ml"
    assert p["custom_details"]["diagnosis"]["evidence"]
    assert body["links"] == [
        {
            "href": f"https://diag.example/v1/diagnoses/{DIAGNOSIS_ID}",
            "text": f"Diagnosis {DIAGNOSIS_ID}",
        }
    ]


def test_user_notices_are_warnings_unless_the_target_says() -> None:
    assert build(audience="user").severity == "warning"
    assert build(audience="user", severity="error").severity == "error"


def test_a_long_idempotency_key_still_fits_pagerduty_and_stays_stable() -> None:
    key = "notify:oncall:" + "k" * 400
    first, second = payloads.dedup_key(key), payloads.dedup_key(key)
    assert first == second
    assert len(first) <= payloads.PAGERDUTY_DEDUP_KEY_CHARS
    assert payloads.dedup_key(key + "x") != first
