"""The notify worker on an in-memory queue: claim, deliver, complete; redelivery after a crash."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from diagnoser.actions.notifier import NotifyWorker, deliver
from diagnoser.actions.notify_wire import ActionView
from diagnoser.config import NotifySettings
from tests.actions.memory_queue import MemoryQueue
from tests.actions.samples import DIAGNOSIS_ID, notify_action
from tests.actions.webhook_receiver import Answer, WebhookReceiver, webhook_receiver

KEY = f"notify:oncall:{DIAGNOSIS_ID}"


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver({"/refuses": [Answer(400, body="no")]}) as r:
        yield r


def settings(receiver: WebhookReceiver, path: str = "/hook") -> NotifySettings:
    return NotifySettings.model_validate(
        {
            "destinations": [{"name": "hook", "url": receiver.url(path)}],
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
        }
    )


async def test_a_claimed_action_is_delivered_and_completed_done(receiver: WebhookReceiver) -> None:
    cordon = notify_action(2).model_copy(update={"kind": "cordon_node", "target": {}})
    queue = MemoryQueue({1: notify_action(1), 2: cordon})
    worker = NotifyWorker(queue, settings(receiver))
    assert await worker.run_once() == 1
    done = queue.actions[1]
    assert done.state == "done"
    assert done.result is not None
    assert done.result["destinations"][0]["outcome"] == "delivered"
    assert done.decisions[-1].reason == "hook: delivered"
    assert queue.actions[2].state == "pending"  # not a notify action: never claimed
    assert len(receiver.at("/hook")) == 1
    assert await worker.run_once() == 0


async def test_a_refused_delivery_completes_failed_with_the_reason(
    receiver: WebhookReceiver,
) -> None:
    queue = MemoryQueue({1: notify_action(1)})
    await NotifyWorker(queue, settings(receiver, "/refuses")).run_once()
    failed = queue.actions[1]
    assert failed.state == "failed"
    assert failed.decisions[-1].reason == "hook: rejected (HTTP 400: no)"
    assert failed.result is not None
    assert failed.result["destinations"][0]["status"] == 400


async def test_an_invalid_target_fails_without_sending(receiver: WebhookReceiver) -> None:
    queue = MemoryQueue({1: notify_action(1).model_copy(update={"target": {"message": "m"}})})
    await NotifyWorker(queue, settings(receiver)).run_once()
    assert queue.actions[1].state == "failed"
    assert "no valid notify target" in queue.actions[1].decisions[-1].reason
    assert receiver.received == []


async def test_a_crash_before_completion_redelivers_under_the_same_key(
    receiver: WebhookReceiver,
) -> None:
    queue = MemoryQueue({1: notify_action(1)})
    s = settings(receiver)
    # A first worker claims and delivers, then dies before it can complete the action.
    (claimed,) = await queue.claim(["notify"], 10, s.lease_seconds)
    assert (await deliver(claimed, s)).ok
    worker = NotifyWorker(queue, s)
    assert await worker.run_once() == 0  # still leased to the dead worker
    queue.clock.advance(s.lease_seconds + 1)
    assert await worker.run_once() == 1
    assert queue.actions[1].state == "done"
    assert queue.actions[1].attempts == 2
    assert len(receiver.at("/hook")) == 2
    assert receiver.alerts("/hook") == {KEY}


async def test_the_loop_runs_until_stopped(receiver: WebhookReceiver) -> None:
    queue = MemoryQueue({i: notify_action(i) for i in range(1, 4)})
    stop = asyncio.Event()
    task = asyncio.create_task(
        NotifyWorker(queue, settings(receiver), batch=2, idle_s=0.05).run(stop)
    )
    async with asyncio.timeout(30):
        await queue.wait_until(lambda q: all(a.state == "done" for a in q.actions.values()))
        claims = queue.claims
        await queue.wait_until(lambda q: q.claims > claims)  # it keeps polling an empty queue
    stop.set()
    await asyncio.wait_for(task, 30)
    assert len(receiver.at("/hook")) == 3


@dataclass
class StartingQueue(MemoryQueue):
    """A queue whose first claims fail, as a service that is still starting refuses them."""

    down_for: int = 2

    async def claim(self, kinds: Sequence[str], max: int, lease_seconds: int) -> list[ActionView]:
        if self.claims < self.down_for:
            self.claims += 1
            raise ConnectionError("service not up yet")
        return await super().claim(kinds, max, lease_seconds)


async def test_the_loop_outlives_a_queue_that_is_down(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    queue = StartingQueue({1: notify_action(1)})
    stop = asyncio.Event()
    task = asyncio.create_task(NotifyWorker(queue, settings(receiver), idle_s=0.05).run(stop))
    async with asyncio.timeout(30):
        await queue.wait_until(lambda q: q.actions[1].state == "done")
    stop.set()
    await asyncio.wait_for(task, 30)
    assert "claim or completion failed" in caplog.text
