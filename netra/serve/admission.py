"""Bounded upstream work per response layer, granted in arrival order.

A request asks for `weight` permits (its choices that run at once) before anything is sent to the
worker, and holds them until its upstream requests end. At most `capacity` permits are out, so the
worker connection pool, the worker's queue and this event loop all see a bounded number of upstream
requests however many clients arrive. Waiting requests are served strictly first come, first
served, each granted all its permits at once (a request never holds some permits while waiting for
more, so two large requests cannot deadlock each other). The caller bounds a request's weight
(`ServeConfig.request_share`), so one request cannot take the whole process.

Past capacity, a request is refused with 503 and `Retry-After` rather than kept waiting without
bound: when `max_waiting` requests already wait, or when its own wait passes `wait_timeout_s`.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from netra.web.errors import at_capacity


class Admission:
    def __init__(self, capacity: int, max_waiting: int, wait_timeout_s: float) -> None:
        if capacity < 1 or max_waiting < 0 or wait_timeout_s <= 0:
            raise ValueError(f"admission: capacity {capacity}, max_waiting {max_waiting}, "
                             f"wait_timeout_s {wait_timeout_s}: expected >= 1, >= 0, > 0")
        self.capacity = capacity
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self.free = capacity
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.refused = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def in_use(self) -> int:
        return self.capacity - self.free

    def retry_after_s(self) -> int:
        return max(1, min(60, math.ceil(self.wait_timeout_s / 4)))

    def _refuse(self, why: str) -> Exception:
        self.refused += 1
        return at_capacity(why, self.retry_after_s())

    async def acquire(self, weight: int) -> None:
        """Wait for `weight` permits (1 <= weight <= capacity); raises a 503 past capacity."""
        if not 1 <= weight <= self.capacity:
            raise ValueError(f"admission weight {weight} outside 1..{self.capacity}")
        if not self._waiters and self.free >= weight:
            self.free -= weight
            return
        if len(self._waiters) >= self.max_waiting:
            raise self._refuse(f"{len(self._waiters)} requests are already waiting")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (weight, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_timeout_s):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release(weight)  # granted just as the wait ended: hand the permits on
            else:
                fut.cancel()
                if entry in self._waiters:  # `_grant` drops entries whose wait has already ended
                    self._waiters.remove(entry)
                self._grant()  # a large request that left may unblock smaller ones behind it
            if isinstance(exc, TimeoutError):
                raise self._refuse(f"no upstream slot within {self.wait_timeout_s:g} s") from None
            raise

    def release(self, weight: int) -> None:
        self.free += weight
        assert self.free <= self.capacity, "admission: released more permits than were granted"
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            weight, fut = self._waiters.popleft()
            if fut.done():  # cancelled or timed out already; its cleanup removes nothing twice
                continue
            self.free -= weight
            fut.set_result(None)

    @asynccontextmanager
    async def hold(self, weight: int) -> AsyncIterator[None]:
        await self.acquire(weight)
        try:
            yield
        finally:
            self.release(weight)
