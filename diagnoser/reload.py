"""Hot reload of the rule pack: on file change or on request, never leaving a broken set active."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import anyio
from watchfiles import awatch

from diagnoser.rules import Problem, RuleLoadError, RuleRegistry
from diagnoser.store.models import utcnow

log = logging.getLogger("diagnoser.rules")


@dataclass
class RuleReloader:
    registry: RuleRegistry
    loaded_at: datetime = field(default_factory=utcnow)
    last_error: tuple[Problem, ...] = ()
    """Problems of the last failed reload; empty once a reload succeeds."""

    async def reload(self) -> None:
        """Validate and swap; raises RuleLoadError (the previous set stays active)."""
        try:
            await anyio.to_thread.run_sync(self.registry.reload)
        except RuleLoadError as exc:
            self.last_error = exc.problems
            log.error("rule reload rejected, keeping digest %s: %s", self.registry.digest, exc)
            raise
        self.last_error = ()
        self.loaded_at = utcnow()
        log.info("rules reloaded: digest %s", self.registry.digest)

    async def watch(self, stop: anyio.Event) -> None:
        """Reload whenever a file under the rule directory changes (debounced by watchfiles).

        Returns soon after `stop` is set. Cancelling alone is not enough: the watch runs in a
        thread that only looks up every few seconds, and shutdown would wait for it.
        """
        async for _ in awatch(
            self.registry.directory, debounce=500, recursive=False, stop_event=stop
        ):
            try:
                await self.reload()
            except RuleLoadError:
                continue
        log.info("rule watcher stopped")
