"""The service's own notifier: a diagnosis that needs a person pages them through a webhook."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.actions.webhook_receiver import webhook_receiver
from tests.conftest import run_service
from tests.servers import post_text as send
from tests.servers import wait_until

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
    " capacity of 79.15 GiB of which 1.02 GiB is free.\n"
)


def test_a_user_error_is_delivered_to_the_webhook_and_the_action_is_done(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        destinations = [{"name": "team", "kind": "generic", "url": receiver.url("/hook")}]
        env = {
            "DIAGNOSER_DATA_DIR": str(tmp_path),
            "DIAGNOSER_ACTIONS__DRY_RUN": "false",
            "DIAGNOSER_ACTIONS__POLL_INTERVAL_S": "0.2",
            "DIAGNOSER_NOTIFY__DESTINATIONS": json.dumps(destinations),
        }
        service = run_service(env)
        process = next(service)
        try:
            send(process, "train-oom", "node-1", OOM)
            wait_until(lambda: receiver.at("/hook"), 60, "the webhook delivery")

            def done() -> list[dict[str, object]]:
                answer = httpx.get(
                    f"{process.base_url}/v1/actions",
                    params={"job_id": "train-oom", "kind": "notify", "state": "done"},
                )
                items: list[dict[str, object]] = answer.json()["items"]
                return items

            wait_until(done, 30, "the notify action done")
            (action,) = done()
        finally:
            next(service, None)
    (delivery,) = receiver.at("/hook")
    assert delivery.json["diagnosis"]["job_id"] == "train-oom"
    assert delivery.headers["idempotency-key"] == action["idempotency_key"]
    assert action["result"]["destinations"][0]["outcome"] == "delivered"  # type: ignore[index]
