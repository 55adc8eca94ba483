"""Host/device overlap of the scheduler: the step clock (host time per step, device idle gap between steps).

A step's host work (admission, batch building, output processing) overlaps the device only while the
device has queued work; `netra.ops._common.to_device` keeps batch building from synchronising (pinned staging
buffer and an asynchronous copy), so the only synchronisation of a step is the one that reads its sampled tokens.
`StepClock` times that wait and brackets each step's device work with CUDA events: the gap between one
step's last event and the next step's first is the device's idle time between steps. On a CPU there is
no separate device: the gap is the step's host time (the step less its forward and sampling).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch


class StepClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_device = device.type == "cuda"
        self.wait_s = 0.0  # this step's wait for the device
        # this step's device time, its first device work to its last wait's end (None: no wait, or a CPU)
        self.device_s: float | None = None
        self._start: torch.cuda.Event | None = None
        self._end: torch.cuda.Event | None = None
        self._prev_end: torch.cuda.Event | None = None
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self._chained = False

    def begin(self) -> None:
        """Before the step's first device work (admission zeroes the new slots' state)."""
        self.wait_s = 0.0
        self.device_s = None
        self._end = None
        if self.on_device:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))

    def sync(self) -> None:
        """Mark the end of the step's device work, then wait for it (before reading results), timed."""
        if self.on_device:
            self._end = torch.cuda.Event(enable_timing=True)
            self._end.record(torch.cuda.current_stream(self.device))
            t = time.perf_counter()
            self._end.synchronize()
            self.wait_s += time.perf_counter() - t
            if self._start is not None:
                self.device_s = self._start.elapsed_time(self._end) / 1e3

    def wait(self, event: Any) -> None:
        """A chained step's wait: for one earlier step's completion event only (later work stays queued). Its
        device time is not read (its work started before this step's first event), and it leaves no gap: the
        device had the next step queued all along."""
        if self.on_device and event is not None:
            t = time.perf_counter()
            event.synchronize()
            self.wait_s += time.perf_counter() - t
        self._chained = True

    def end(self) -> float:
        """At the end of the step: the device idle gaps resolved so far, in seconds. A gap runs from the
        end of one step's device work (its `sync`) to the first device work of the next (`begin`): the
        device idles while the host reads the tokens, emits outputs, admits and builds the next batch.
        It is resolved once the next step's first event has run (read without waiting)."""
        if not self.on_device or self._start is None:
            return 0.0
        if self._chained:
            self._chained = False
            self._start, self._end, self._prev_end = None, None, None
            self._pending.clear()
            return 0.0
        end = self._end
        if end is None:  # a step that did not wait (a prefill step finishing no prompt): its work ends here
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
        self._end = None
        if self._prev_end is not None:
            self._pending.append((self._prev_end, self._start))
        self._prev_end, self._start = end, None
        gap = 0.0
        while self._pending and self._pending[0][1].query():
            prev, start = self._pending.popleft()
            gap += max(0.0, prev.elapsed_time(start)) / 1e3
        return gap
