"""The notifier against a real HTTP receiver on loopback: payloads, retries, idempotency."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from diagnoser.actions.notifier import backoff, deliver, retry_after, route
from diagnoser.actions.notify_wire import NotifyTarget
from diagnoser.config import NotifyDestination, NotifySettings
from tests.actions.samples import DIAGNOSIS_ID, notify_action
from tests.actions.webhook_receiver import Answer, WebhookReceiver, webhook_receiver
from tests.servers import free_port, run_diagnoser

KEY = f"notify:oncall:{DIAGNOSIS_ID}"
SECRET = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6"


class Ceiling(random.Random):
    """Jitter that always picks the longest wait: a deterministic worst case."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as r:
        yield r


def settings(*destinations: dict[str, Any], **options: Any) -> NotifySettings:
    return NotifySettings.model_validate(
        {
            "destinations": list(destinations),
            "public_url": "https://diag.example/",
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "request_timeout_s": 5,
            **options,
        }
    )


async def test_generic_webhook_gets_the_diagnosis_with_the_idempotency_key(
    receiver: WebhookReceiver,
) -> None:
    s = settings({"name": "hook", "kind": "generic", "url": receiver.url("/hook")})
    result = await deliver(notify_action(), s)
    assert result.ok
    assert [d.outcome for d in result.destinations] == ["delivered"]
    (got,) = receiver.at("/hook")
    assert got.headers["idempotency-key"] == KEY
    assert got.headers["content-type"] == "application/json"
    assert got.headers["user-agent"].startswith("diagnoser/")
    body = got.json
    assert body["idempotency_key"] == KEY
    assert body["diagnosis"]["id"] == DIAGNOSIS_ID
    assert body["diagnosis"]["link"] == f"https://diag.example/v1/diagnoses/{DIAGNOSIS_ID}"
    assert body["diagnosis"]["evidence"][0].startswith("[node-3] NVRM")


async def test_slack_and_pagerduty_receive_their_own_formats(receiver: WebhookReceiver) -> None:
    s = settings(
        {"name": "chat", "kind": "slack", "url": receiver.url("/services/T0/B0/xyz")},
        {
            "name": "pager",
            "kind": "pagerduty",
            "url": receiver.url("/v2/enqueue"),
            "routing_key": "R0UTING0KEY0123456789012345678901",
        },
    )
    result = await deliver(notify_action(), s)
    assert result.ok
    assert {d.name for d in result.destinations} == {"chat", "pager"}

    (slack,) = receiver.at("/services/T0/B0/xyz")
    message = slack.json
    assert isinstance(message["text"], str)
    assert message["text"]
    assert message["blocks"][0]["type"] == "header"
    assert {b["type"] for b in message["blocks"]} <= {"header", "section", "context"}
    assert message["unfurl_links"] is False

    (pager,) = receiver.at("/v2/enqueue")
    event = pager.json
    assert event["routing_key"] == "R0UTING0KEY0123456789012345678901"
    assert event["event_action"] == "trigger"
    assert event["dedup_key"] == KEY
    assert set(event["payload"]) >= {"summary", "source", "severity", "custom_details"}
    assert len(event["payload"]["summary"]) <= 1024
    assert event["links"][0]["href"].endswith(f"/v1/diagnoses/{DIAGNOSIS_ID}")
    assert pager.headers["idempotency-key"] == KEY


async def test_503_is_retried_until_it_succeeds() -> None:
    script = {"/hook": [Answer(503), Answer(503), Answer(200)]}
    with webhook_receiver(script) as receiver:
        s = settings({"name": "hook", "url": receiver.url("/hook")})
        result = await deliver(notify_action(), s)
        sent = receiver.at("/hook")
    assert result.ok
    assert result.destinations[0].attempts == 3
    assert len(sent) == 3
    assert {r.headers["idempotency-key"] for r in sent} == {KEY}
    assert len({r.raw for r in sent}) == 1  # the same body every time


async def test_429_waits_for_retry_after_rather_than_its_own_backoff() -> None:
    # The worst-case backoff (Ceiling) is far past the deadline: only the server's
    # Retry-After of 1 s lets the second attempt happen within it.
    script = {"/hook": [Answer(429, headers={"Retry-After": "1"}), Answer(200)]}
    with webhook_receiver(script) as receiver:
        s = settings(
            {"name": "hook", "url": receiver.url("/hook")},
            backoff_base_s=600,
            backoff_max_s=600,
            deadline_s=30,
        )
        result = await deliver(notify_action(), s, rng=Ceiling())
    assert result.ok
    assert result.destinations[0].attempts == 2


async def test_a_retry_after_past_the_deadline_gives_up_at_once() -> None:
    script = {"/hook": [Answer(503, headers={"Retry-After": "3600"})]}
    with webhook_receiver(script) as receiver:
        s = settings({"name": "hook", "url": receiver.url("/hook")}, deadline_s=30)
        result = await deliver(notify_action(), s)
        assert len(receiver.at("/hook")) == 1
    (d,) = result.destinations
    assert (d.outcome, d.attempts, d.status) == ("gave_up", 1, 503)
    assert d.error is not None
    assert "past the deadline" in d.error


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
async def test_other_4xx_is_never_retried(status: int) -> None:
    script = {"/hook": [Answer(status, body="invalid_payload"), Answer(200)]}
    with webhook_receiver(script) as receiver:
        s = settings({"name": "hook", "url": receiver.url("/hook")})
        result = await deliver(notify_action(), s)
        assert len(receiver.at("/hook")) == 1
    (d,) = result.destinations
    assert (d.outcome, d.attempts, d.status) == ("rejected", 1, status)
    assert d.error == f"HTTP {status}: invalid_payload"
    assert not result.ok


async def test_a_redirect_is_not_followed_even_by_a_client_that_would() -> None:
    script = {"/hook": [Answer(307, headers={"Location": "/elsewhere"})]}
    with webhook_receiver(script) as receiver:
        s = settings({"name": "hook", "url": receiver.url("/hook")})
        async with httpx.AsyncClient(follow_redirects=True) as client:
            result = await deliver(notify_action(), s, client=client)
        assert receiver.at("/elsewhere") == []
    assert result.destinations[0].outcome == "rejected"


async def test_redelivery_sends_the_same_key_and_the_receiver_sees_one_alert(
    receiver: WebhookReceiver,
) -> None:
    s = settings(
        {"name": "hook", "url": receiver.url("/hook")},
        {"name": "pager", "kind": "pagerduty", "url": receiver.url("/pd"), "routing_key": "rk"},
    )
    action = notify_action()
    await deliver(action, s)
    redelivered = action.model_copy(update={"attempts": 2, "state": "claimed"})
    await deliver(redelivered, s)
    assert len(receiver.at("/hook")) == 2
    assert receiver.alerts("/hook") == {KEY}
    assert {r.json["dedup_key"] for r in receiver.at("/pd")} == {KEY}


async def test_secrets_never_reach_the_wire(receiver: WebhookReceiver) -> None:
    s = settings(
        {"name": "hook", "url": receiver.url("/hook")},
        {"name": "chat", "kind": "slack", "url": receiver.url("/slack")},
        {"name": "pager", "kind": "pagerduty", "url": receiver.url("/pd"), "routing_key": "rk"},
        redact_patterns=[r"cluster-internal-\w+"],
    )
    action = notify_action(
        message=f"OPENAI_API_KEY={SECRET}",
        summary="postgres://trainer:s3cretpass@db.internal:5432/runs failed",
        evidence=[f"curl -H 'Authorization: Bearer {SECRET}'", "host cluster-internal-zeta"],
    )
    result = await deliver(action, s)
    assert result.ok
    assert len(receiver.received) == 3
    for got in receiver.received:
        assert SECRET.encode() not in got.raw
        assert b"s3cretpass" not in got.raw
        assert b"cluster-internal-zeta" not in got.raw
        assert b"[REDACTED:" in got.raw
    assert result.redactions["custom"] == 1


async def test_slack_injection_arrives_escaped(receiver: WebhookReceiver) -> None:
    s = settings({"name": "chat", "kind": "slack", "url": receiver.url("/slack")})
    action = notify_action(
        evidence=["<!channel> rank 0: <https://evil.example|reset password> @here"],
        message="<!here|here> job failed",
    )
    await deliver(action, s)
    (got,) = receiver.at("/slack")
    raw = got.raw.decode()
    assert "<!channel>" not in raw
    assert "<!here" not in raw
    assert "<https://evil.example" not in raw
    assert "&lt;!channel&gt;" in raw


async def test_a_receiver_that_never_answers_times_out_within_the_deadline() -> None:
    script = {"/slow": [Answer(200, delay_s=3)]}
    with webhook_receiver(script) as receiver:
        s = settings(
            {"name": "slow", "url": receiver.url("/slow")},
            request_timeout_s=0.3,
            deadline_s=1,
            max_attempts=10,
        )
        result = await deliver(notify_action(), s)
    (d,) = result.destinations
    assert d.outcome == "gave_up"
    assert d.status is None
    assert d.error is not None
    assert "Timeout" in d.error
    assert d.attempts < 10  # the deadline, not the attempt budget, ended it


async def test_connection_errors_are_retried_and_the_url_stays_out_of_the_result() -> None:
    url = f"http://127.0.0.1:{free_port()}/services/T000/B000/SECRETTOKEN"
    s = settings({"name": "chat", "kind": "slack", "url": url}, max_attempts=3)
    result = await deliver(notify_action(), s)
    (d,) = result.destinations
    assert (d.outcome, d.attempts, d.status) == ("gave_up", 3, None)
    assert d.error is not None
    assert "ConnectError" in d.error
    assert "SECRETTOKEN" not in repr(result.as_json()) + result.message


async def test_one_failing_destination_does_not_stop_the_others() -> None:
    script = {"/bad": [Answer(400)]}
    with webhook_receiver(script) as receiver:
        s = settings(
            {"name": "bad", "url": receiver.url("/bad")},
            {"name": "good", "url": receiver.url("/good")},
        )
        result = await deliver(notify_action(), s)
    assert not result.ok
    outcomes = {d.name: d.outcome for d in result.destinations}
    assert outcomes == {"bad": "rejected", "good": "delivered"}
    assert "bad: rejected" in result.message


async def test_a_shared_client_is_used_and_left_open(receiver: WebhookReceiver) -> None:
    s = settings({"name": "hook", "url": receiver.url("/hook")})
    async with httpx.AsyncClient() as client:
        assert (await deliver(notify_action(), s, client=client)).ok
        assert (await deliver(notify_action(8), s, client=client)).ok
        assert not client.is_closed


async def test_a_non_notify_action_is_refused() -> None:
    action = notify_action().model_copy(update={"kind": "cordon_node"})
    with pytest.raises(ValueError, match="not 'notify'"):
        await deliver(action, settings())


def test_routing_by_family_namespace_and_audience_with_a_default() -> None:
    s = NotifySettings.model_validate(
        {
            "destinations": [
                {"name": "llama", "url": "http://h/1", "match": {"families": ["llama-70b"]}},
                {"name": "ml-ns", "url": "http://h/2", "match": {"namespaces": ["ml"]}},
                {
                    "name": "pager",
                    "kind": "pagerduty",
                    "routing_key": "rk",
                    "match": {"audiences": ["oncall"], "namespaces": ["prod"]},
                },
                {"name": "fallback", "url": "http://h/3"},
            ],
            "default": "fallback",
        }
    )

    def names(family: str, **target: Any) -> list[str]:
        t = NotifyTarget.model_validate({"audience": "user", "message": "m", **target})
        return [d.name for d in route(s, t, family)]

    assert names("llama-70b", namespace="ml") == ["llama", "ml-ns"]
    assert names("gpt", namespace="ml") == ["ml-ns"]
    assert names("gpt", namespace="prod") == ["fallback"]
    assert names("gpt", namespace="prod", audience="oncall") == ["pager"]
    assert names("gpt") == ["fallback"]


async def test_no_matching_destination_sends_nothing(receiver: WebhookReceiver) -> None:
    s = settings({"name": "hook", "url": receiver.url("/hook"), "match": {"namespaces": ["other"]}})
    result = await deliver(notify_action(), s)
    assert result.destinations == ()
    assert result.ok
    assert "no notify destination" in result.message
    assert receiver.received == []


def test_retry_after_reads_seconds_and_http_dates() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after(httpx.Response(429, headers={"Retry-After": "7"}), now) == 7
    dated = httpx.Response(429, headers={"Retry-After": "Tue, 01 Dec 2026 12:00:30 GMT"})
    assert retry_after(dated, now) == 30
    assert retry_after(httpx.Response(429, headers={"Retry-After": "soon"}), now) is None
    assert retry_after(httpx.Response(503), now) is None


def test_destination_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="needs routing_key"):
        NotifyDestination.model_validate({"name": "pd", "kind": "pagerduty"})
    with pytest.raises(ValueError, match="needs url"):
        NotifyDestination.model_validate({"name": "s", "kind": "slack"})
    with pytest.raises(ValueError, match="http"):
        NotifyDestination.model_validate({"name": "s", "url": "file:///etc/passwd"})
    with pytest.raises(ValueError, match="names no destination"):
        NotifySettings.model_validate({"default": "nope"})
    with pytest.raises(ValueError, match="longer than deadline"):
        NotifySettings.model_validate({"deadline_s": 120, "lease_seconds": 60})
    pd = NotifyDestination.model_validate({"name": "pd", "kind": "pagerduty", "routing_key": "k"})
    assert pd.url is not None
    assert pd.url.get_secret_value() == "https://events.pagerduty.com/v2/enqueue"
    assert "hooks" not in repr(
        NotifyDestination.model_validate({"name": "s", "url": "https://hooks.slack.com/x"})
    )


async def test_a_key_that_is_not_printable_ascii_is_percent_encoded_in_the_header(
    receiver: WebhookReceiver,
) -> None:
    s = settings({"name": "hook", "url": receiver.url("/hook")})
    action = notify_action().model_copy(update={"idempotency_key": "notify:user:jöb\n1"})
    assert (await deliver(action, s)).ok
    (got,) = receiver.at("/hook")
    assert got.headers["idempotency-key"] == "notify%3Auser%3Aj%C3%B6b%0A1"
    assert got.json["idempotency_key"] == "notify:user:jöb\n1"


def test_destinations_come_from_the_environment_as_documented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from diagnoser.config import Settings

    monkeypatch.setenv(
        "DIAGNOSER_NOTIFY__DESTINATIONS",
        '[{"name": "ml-slack", "kind": "slack", "url": "https://hooks.slack.com/services/T/B/x",'
        ' "match": {"namespaces": ["ml"]}},'
        ' {"name": "oncall", "kind": "pagerduty", "routing_key": "R0UTINGKEY",'
        ' "match": {"audiences": ["oncall"]}}]',
    )
    monkeypatch.setenv("DIAGNOSER_NOTIFY__DEFAULT", "oncall")
    monkeypatch.setenv("DIAGNOSER_NOTIFY__PUBLIC_URL", "https://diagnoser.example.com/")
    notify = Settings().notify
    assert [d.name for d in notify.destinations] == ["ml-slack", "oncall"]
    assert notify.destinations[0].match.namespaces == ["ml"]
    assert notify.default == "oncall"
    assert notify.public_url == "https://diagnoser.example.com"
    assert "R0UTINGKEY" not in repr(notify)
    assert "hooks.slack.com" not in repr(notify)


def test_backoff_doubles_up_to_its_cap_with_full_jitter() -> None:
    s = NotifySettings(backoff_base_s=0.5, backoff_max_s=20)
    assert [backoff(n, s, Ceiling()) for n in (1, 2, 3, 6, 7, 12)] == [0.5, 1, 2, 16, 20, 20]
    rng = random.Random(1)
    assert all(0 <= backoff(3, s, rng) <= 2 for _ in range(100))


@pytest.mark.parametrize(
    "destinations",
    [
        '[{"name": "pd", "kind": "pagerduty", "routing_key": "SUPERSECRET", "url": "ftp://x"}]',
        '[{"name": "chat", "kind": "slack", "uri": "https://hooks.slack.com/SUPERSECRET"}]',
    ],
)
def test_a_bad_destination_stops_the_cli_without_echoing_its_secrets(destinations: str) -> None:
    result = run_diagnoser("rules", "check", env={"DIAGNOSER_NOTIFY__DESTINATIONS": destinations})
    assert result.returncode == 2
    assert "error: DIAGNOSER_NOTIFY__DESTINATIONS" in result.stderr
    assert "Traceback" not in result.stderr
    assert "SUPERSECRET" not in result.stderr + result.stdout


def test_destinations_that_are_not_json_end_in_one_error_line() -> None:
    broken = '[{"name": "x", "url": "https://hooks.slack.com/SUPERSECRET"'
    result = run_diagnoser("rules", "check", env={"DIAGNOSER_NOTIFY__DESTINATIONS": broken})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith('error: parsing value for field "notify"')
    assert "SUPERSECRET" not in result.stderr


async def test_a_typed_target_model_is_read_like_its_json(receiver: WebhookReceiver) -> None:
    # The richer wire models to come type each kind's target; the notifier takes those too.
    plain = notify_action()
    typed = plain.model_copy(update={"target": NotifyTarget.model_validate(plain.target)})
    s = settings({"name": "hook", "url": receiver.url("/hook")})
    assert (await deliver(plain, s)).ok
    assert (await deliver(typed, s)).ok
    first, second = receiver.at("/hook")
    assert first.json == second.json
