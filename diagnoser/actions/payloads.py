"""What a `notify` action becomes on the wire: generic JSON, Slack, PagerDuty Events v2.

Everything here is pure. `notice()` turns an action into a `Notice`: every text field redacted
(the built-in secret patterns plus configured ones), stripped of terminal control sequences and
clipped, the evidence capped at `MAX_EVIDENCE_LINES`. The three payload builders only arrange a
`Notice`; the Slack one also escapes it, since log text is untrusted and Slack reads `<...>` as
links and mentions (`<!channel>`, `<@U123>`) and some workspaces expand a bare `@here`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import regex

from diagnoser.actions.notify_wire import ActionView, Audience, NotifyTarget, Severity
from diagnoser.llm.redaction import Redactor
from diagnoser.templates.family import family_of

MAX_EVIDENCE_LINES = 20
MAX_LINE_CHARS = 500
MAX_SUMMARY_CHARS = 1000
MAX_MESSAGE_CHARS = 2000
MAX_NAME_CHARS = 253
MAX_NODES = 64

SLACK_TEXT_CHARS = 3000
"""Slack's limit for a section's text and for the message's fallback `text` we send."""
SLACK_HEADER_CHARS = 150
SLACK_FIELD_CHARS = 2000
PAGERDUTY_SUMMARY_CHARS = 1024
PAGERDUTY_DEDUP_KEY_CHARS = 255
ELLIPSIS = "…"

_TERMINAL = regex.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b")
_CONTROL = regex.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BROADCAST = regex.compile(r"(?i)@(channel|here|everyone)\b")
_WORD_JOINER = "\u2060"


@dataclass(frozen=True, slots=True)
class Notice:
    """One `notify` action, redacted and bounded: the only input of the payload builders."""

    action_id: int
    idempotency_key: str
    diagnosis_id: str
    job_id: str
    family: str
    namespace: str | None
    audience: Audience
    severity: Severity
    category: str | None
    failure_type: str | None
    action: str | None
    culprit_nodes: tuple[str, ...]
    summary: str
    message: str
    reason: str
    evidence: tuple[str, ...]
    link: str | None
    created_at: datetime
    redactions: dict[str, int]
    """Secrets removed, by kind (never what they were)."""


def notice(
    action: ActionView, target: NotifyTarget, redactor: Redactor, public_url: str | None
) -> Notice:
    counts: Counter[str] = Counter()

    def clean(text: str, limit: int) -> str:
        text = _CONTROL.sub(" ", _TERMINAL.sub("", text))
        redacted = redactor.redact(text)
        counts.update(redacted.counts)
        return clip(redacted.text, limit)

    def maybe(text: str | None) -> str | None:
        return None if text is None else clean(text, MAX_NAME_CHARS)

    link = diagnosis_link(action.diagnosis_id, public_url, target.diagnosis_url)
    return Notice(
        action_id=action.id,
        idempotency_key=action.idempotency_key,
        diagnosis_id=clean(action.diagnosis_id, MAX_NAME_CHARS),
        job_id=clean(action.job_id, MAX_NAME_CHARS),
        family=clean(target.family or family_of(action.job_id), MAX_NAME_CHARS),
        namespace=maybe(target.namespace),
        audience=target.audience,
        severity=target.severity or ("critical" if target.audience == "oncall" else "warning"),
        category=maybe(target.category),
        failure_type=maybe(target.failure_type),
        action=maybe(target.action),
        culprit_nodes=tuple(clean(n, MAX_NAME_CHARS) for n in target.culprit_nodes[:MAX_NODES]),
        summary=clean(target.summary, MAX_SUMMARY_CHARS),
        message=clean(target.message, MAX_MESSAGE_CHARS),
        reason=clean(action.reason, MAX_MESSAGE_CHARS),
        evidence=tuple(
            clean(line, MAX_LINE_CHARS) for line in target.evidence[:MAX_EVIDENCE_LINES]
        ),
        link=None if link is None else clean(link, MAX_MESSAGE_CHARS),
        created_at=action.created_at,
        redactions=dict(counts),
    )


def diagnosis_link(diagnosis_id: str, public_url: str | None, fallback: str | None) -> str | None:
    """`{public_url}/v1/diagnoses/{id}`; else the URL the service put in the target, if any."""
    if public_url:
        return f"{public_url}/v1/diagnoses/{quote(diagnosis_id, safe='')}"
    if fallback and fallback.startswith(("http://", "https://")):
        return fallback
    return None


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def headline(n: Notice) -> str:
    what = n.failure_type or n.category or "failure"
    where = f" on {', '.join(n.culprit_nodes[:3])}" if n.culprit_nodes else ""
    return f"{what} in job {n.job_id}{where}"


def diagnosis_fields(n: Notice) -> dict[str, Any]:
    return {
        "id": n.diagnosis_id,
        "job_id": n.job_id,
        "family": n.family,
        "namespace": n.namespace,
        "category": n.category,
        "failure_type": n.failure_type,
        "action": n.action,
        "culprit_nodes": list(n.culprit_nodes),
        "summary": n.summary,
        "evidence": list(n.evidence),
        "link": n.link,
    }


def generic_payload(n: Notice) -> dict[str, Any]:
    """The diagnoser's own JSON: stable keys, for receivers written against this service."""
    return {
        "type": "diagnoser.notify",
        "version": 1,
        "action_id": n.action_id,
        "idempotency_key": n.idempotency_key,
        "audience": n.audience,
        "severity": n.severity,
        "message": n.message,
        "reason": n.reason,
        "created_at": n.created_at.isoformat(),
        "diagnosis": diagnosis_fields(n),
        "redactions": n.redactions,
    }


def slack_escape(text: str) -> str:
    """Untrusted text as inert Slack mrkdwn: no links, mentions or broadcasts of its own."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub(lambda m: f"@{_WORD_JOINER}{m.group(1)}", text)


def slack_clip(text: str, limit: int) -> str:
    """Escape, then clip without cutting an `&amp;`-style entity in half."""
    escaped = slack_escape(text)
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + ELLIPSIS


def slack_code(lines: tuple[str, ...], limit: int) -> str:
    """Evidence as a code block that the log text cannot close (no "```" survives)."""
    fence = "```"
    body: list[str] = []
    used = 2 * len(fence) + 2
    for line in lines:
        escaped = slack_escape(line).replace("`", "`" + _WORD_JOINER)
        if used + len(escaped) + 1 > limit:
            body.append(ELLIPSIS)
            break
        body.append(escaped)
        used += len(escaped) + 1
    return fence + "\n" + "\n".join(body) + "\n" + fence


def slack_payload(n: Notice) -> dict[str, Any]:
    """An incoming-webhook message: fallback `text` plus blocks, each inside Slack's limits."""
    title = clip(f"Diagnosis: {headline(n)}", SLACK_HEADER_CHARS)
    fields = [
        ("Job", n.job_id),
        ("Namespace", n.namespace or "-"),
        ("Failure type", n.failure_type or "-"),
        ("Category", n.category or "-"),
        ("Recommended action", n.action or "-"),
        ("Culprit nodes", ", ".join(n.culprit_nodes) or "-"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": slack_clip(title, 150)}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": slack_clip(f"{n.message}\n{n.summary}".strip(), SLACK_TEXT_CHARS),
            },
        },
        {
            "type": "section",
            "fields": [
                {
                    "type": "mrkdwn",
                    "text": f"*{name}*\n" + slack_clip(value, SLACK_FIELD_CHARS - 64),
                }
                for name, value in fields
            ],
        },
    ]
    if n.evidence:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": slack_code(n.evidence, SLACK_TEXT_CHARS)},
            }
        )
    if n.link:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"<{slack_link(n.link)}|Open the diagnosis>"},
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": slack_clip(
                        f"action {n.action_id} · for {n.audience} · key {n.idempotency_key}",
                        SLACK_FIELD_CHARS,
                    ),
                }
            ],
        }
    )
    return {
        "text": slack_clip(f"{headline(n)}: {n.summary or n.message}", SLACK_TEXT_CHARS),
        "blocks": blocks,
        "unfurl_links": False,
        "unfurl_media": False,
    }


def slack_link(url: str) -> str:
    """A URL inside `<url|label>`: the characters that would end it are percent-encoded."""
    return url.replace("&", "%26").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def dedup_key(idempotency_key: str) -> str:
    """The idempotency key, or, past PagerDuty's 255 characters, its prefix plus a digest."""
    if len(idempotency_key) <= PAGERDUTY_DEDUP_KEY_CHARS:
        return idempotency_key
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()
    return idempotency_key[: PAGERDUTY_DEDUP_KEY_CHARS - len(digest) - 1] + ":" + digest


def pagerduty_payload(n: Notice, routing_key: str) -> dict[str, Any]:
    """An Events API v2 `trigger`; the same `dedup_key` again joins the same alert."""
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(n.idempotency_key),
        "client": "diagnoser",
        "payload": {
            "summary": clip(f"{headline(n)}: {n.summary or n.message}", PAGERDUTY_SUMMARY_CHARS),
            "source": n.culprit_nodes[0] if n.culprit_nodes else n.job_id,
            "severity": n.severity,
            "timestamp": n.created_at.isoformat(),
            "component": n.job_id,
            "group": n.namespace or n.family,
            "class": n.failure_type or n.category or "unknown",
            "custom_details": {
                "message": n.message,
                "reason": n.reason,
                "audience": n.audience,
                "action_id": n.action_id,
                "diagnosis": diagnosis_fields(n),
                "redactions": n.redactions,
            },
        },
    }
    if n.link:
        body["client_url"] = n.link
        body["links"] = [{"href": n.link, "text": f"Diagnosis {n.diagnosis_id}"}]
    return body
