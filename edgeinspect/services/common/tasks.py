"""Background asyncio tasks an object starts and owns: referenced until done, failures logged, cancelled on close.

The event loop keeps only weak references to tasks, so a task nobody holds can be collected mid-run; and a task
that raised and is never awaited reports its error only at garbage collection, if ever. Each owner (a router, a
replica set, a stage's stream releases, a rollout's retiring versions) keeps its tasks here and closes them with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    """The running tasks of one owner. `what` names the owner in log records."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._tasks: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task:
        """Starts `coro` on the running loop; the task is held until it ends, and an exception it ends with is
        logged here (cancellation is not an error)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved: asyncio will not report it again at collection
        if exc is not None:
            log.error("%s: background task %s failed", self.what, task.get_name(), exc_info=exc)

    async def close(self) -> None:
        """Cancels every running task and waits until all have ended."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
