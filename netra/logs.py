"""One log format for every Netra process, and a JSON option (`--log-format json` or NETRA_LOG_FORMAT).

Text: ``TIME LEVEL LOGGER: message``. JSON: one object per line with ``time``, ``level``, ``logger``,
``message`` and, for structured lines (the response layer's per-request line), their fields at the
top level. httpx's per-call INFO lines are silenced: the per-request line says what they said.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Configure the root logger of a Netra process (defaults: NETRA_LOG_LEVEL, NETRA_LOG_FORMAT)."""
    from netra import settings

    level = (level or settings.get("NETRA_LOG_LEVEL")).upper()
    fmt = fmt or settings.get("NETRA_LOG_FORMAT")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {FORMATS}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def add_arguments(p: Any) -> None:
    p.add_argument("--log-level", default=None, help="logging level (default: NETRA_LOG_LEVEL, INFO)")
    p.add_argument("--log-format", choices=FORMATS, default=None,
                   help="text, or json: one object per line (default: NETRA_LOG_FORMAT, text)")
