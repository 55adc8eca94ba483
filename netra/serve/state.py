"""What one response-layer process shares across requests (`ServeState`), and the request checks that
read it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import PurePath
from typing import Any

import httpx

from netra.serve.admission import Admission
from netra.serve.config import ServeConfig
from netra.serve.metrics import Metrics
from netra.serve.tokenizer import ModelText, load_for_worker
from netra.serve.upstream import Upstream
from netra.serve.watch import EngineWatch
from netra.web.errors import OpenAIError, model_not_found

log = logging.getLogger("netra.serve")


class ServeState:
    """What one process shares across requests: the pooled upstream client, admission, the worker's
    liveness watch, metrics, and the model's tokenizer (loaded on first use, so start-up does not
    wait for the worker)."""

    def __init__(self, config: ServeConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.metrics = Metrics(lambda: {"worker": config.worker_id, "model_name": self.model_name_now()})
        self.upstream = Upstream(config.upstream_base, config.upstream_timeout, config.pool_size,
                                 transport=transport)
        self.admission = Admission(config.max_inflight, config.max_waiting, config.queue_timeout)
        self.watch = EngineWatch(self.upstream, config.probe_interval, config.probe_timeout,
                                 config.probe_misses, config.stall_timeout)
        self.started = int(time.time())
        self._info: dict[str, Any] | None = None
        self._text: ModelText | None = None
        self._name: str | None = config.model_name
        self._context: int | None = None
        self._lock = asyncio.Lock()

    async def model_info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = await self.upstream.get_json("/model_info")
        return self._info

    async def model_text(self) -> ModelText:
        if self._text is None:
            async with self._lock:
                if self._text is None:
                    info = await self.model_info()
                    # Reading a large tokenizer.json takes a while: keep the event loop serving.
                    self._text = await asyncio.to_thread(load_for_worker, info)
                    log.info("tokenizer loaded from %s", self._text.source)
        return self._text

    async def model_name(self) -> str:
        if self._name is None:
            info = await self.model_info()
            path = info.get("served_model_name") or info.get("model_path")
            if isinstance(path, str) and path.startswith("preset:"):  # the embedded engine's seeded presets
                self._name = f"netra-{path.removeprefix('preset:')}"
            elif isinstance(path, str) and path:
                self._name = path if not PurePath(path).is_absolute() else PurePath(path).name
            else:
                self._name = f"netra-{info.get('preset', 'model')}"
        return self._name

    async def context_length(self) -> int | None:
        """The worker's context length: `/model_info` (netra engine), else SGLang's own `/v1/models`
        card (`max_model_len`), else unknown (the worker's default then applies)."""
        if self._context is None:
            info = await self.model_info()
            value = info.get("context_length") or info.get("max_model_len")
            if not isinstance(value, int):
                try:
                    cards = (await self.upstream.get_json("/v1/models")).get("data") or [{}]
                    value = cards[0].get("max_model_len")
                except OpenAIError:
                    value = None
            self._context = value if isinstance(value, int) and value > 0 else 0
        return self._context or None

    def sampling_defaults(self, text: ModelText) -> dict[str, float | int]:
        """The sampling values a request leaves out (``--sampling-defaults``): the checkpoint's or none."""
        return text.sampling_defaults if self.config.sampling_defaults == "model" else {}

    def model_name_now(self) -> str:
        return self._name or "unknown"

    async def check_model(self, requested: str | None) -> str:
        """The served name; a request naming another model is a 404 `model_not_found`."""
        name = await self.model_name()
        if requested is not None and requested != name:
            raise model_not_found(requested, name)
        return name

    def check_worker(self) -> None:
        """Refuse at once while the worker is unresponsive (nginx passes a 503 to another worker)."""
        if self.watch.unresponsive:
            raise OpenAIError(503, f"the worker is not answering ({self.watch.why})")


def check_choices(state: ServeState, prompts: int, n: int) -> None:
    limit = state.config.max_choices
    if prompts * n > limit:
        raise OpenAIError(400, f"this request asks for {prompts} prompt(s) x n={n} = {prompts * n} choices; the limit "
                               f"is {limit} choices (prompts x n) per request", param="n", code="too_many_choices")
