"""Idempotent submission: a client's key makes a repeated submission return the same job.

Theory of operation
-------------------
gpuctl and the Python API send ``key`` with every ``submit``: a random string they made for
that one submission.  When the answer is lost (the head died after the commit, a proxy cut
the connection), the client sends the same request again with the same key, and the head
answers with the job it already created instead of making a second one.

The key is stored with the job (``jobs.submit_key``, every task of an array) in the same
transaction as the job itself, so "created" and "remembered" cannot come apart.  Keys are
scoped by the caller's uid (nobody learns another user's job through a guessed key) and
honoured for ``RETENTION`` seconds; the map in memory is loaded from the database at start
and pruned as it ages.  A repeat that arrives while the first is still waiting for its group
commit waits for the same answer.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..ctlsocket import RequestError

if TYPE_CHECKING:
    from .store import Store

RETENTION = 24 * 3600.0      # seconds a key is honoured after its submission
KEY = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")


def check_key(value: Any) -> str | None:
    """The request's ``key``, or None without one; RequestError when malformed."""
    if value is None:
        return None
    if not isinstance(value, str) or not KEY.match(value):
        raise RequestError("Batch job submission failed: the submission key must be 8-128 letters, "
                           "digits or ._:- (gpuctl makes one; leave it out otherwise)")
    return value


class SubmitKeys:
    def __init__(self, mono: Callable[[], float]) -> None:
        self._mono = mono
        self._done: dict[tuple[int, str], tuple[dict[str, Any], float]] = {}   # -> (answer, mono time)
        self._waiting: dict[tuple[int, str], asyncio.Future] = {}

    async def load(self, store: "Store", now: float) -> None:
        """The keys of the submissions of the last RETENTION seconds (wall clock ``now``)."""
        mono = self._mono()
        for uid, key, job_id, tasks in await store.submit_keys(now - RETENTION):
            self._done[(uid, key)] = ({"job_id": job_id, "tasks": tasks, "warnings": []}, mono)

    def prune(self) -> None:
        old = self._mono() - RETENTION
        for k in [k for k, (_, at) in self._done.items() if at < old]:
            del self._done[k]

    async def once(self, uid: int, key: str | None, submit: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``submit()``'s answer, or the answer a submission with this key already got."""
        if key is None:
            return await submit()
        k = (uid, key)
        done = self._done.get(k)
        if done is not None:
            return {**done[0], "repeat": True}
        waiting = self._waiting.get(k)
        if waiting is not None:
            return {**await asyncio.shield(waiting), "repeat": True}
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting[k] = fut
        try:
            answer = await submit()
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()   # retrieved: nobody else may be waiting
            raise
        else:
            if len(self._done) % 1024 == 0:
                self.prune()
            self._done[k] = (answer, self._mono())
            fut.set_result(answer)
            return answer
        finally:
            del self._waiting[k]
