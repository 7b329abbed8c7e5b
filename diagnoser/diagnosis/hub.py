"""Fan-out of new and updated diagnoses to live watchers (server-sent events), in-process."""

from __future__ import annotations

import asyncio

from diagnoser.diagnosis.schemas import DiagnosisView

QUEUE_SIZE = 256


class DiagnosisHub:
    """A slow watcher is cut off rather than allowed to grow memory; it can reconnect."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[DiagnosisView | None]] = set()

    def subscribe(self) -> asyncio.Queue[DiagnosisView | None]:
        queue: asyncio.Queue[DiagnosisView | None] = asyncio.Queue(QUEUE_SIZE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[DiagnosisView | None]) -> None:
        self._subscribers.discard(queue)

    def publish(self, view: DiagnosisView) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(view)
            except asyncio.QueueFull:
                self._subscribers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)  # tells the stream to close

    @property
    def watchers(self) -> int:
        return len(self._subscribers)
