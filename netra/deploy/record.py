"""The launch record: one JSON file in the run dir (`launch.json`) with everything a launch started.

It holds the resolved profile and its hash, the plan hash, the verification and audit results, and
per process (engines, response layers, nginx, the launcher itself) its PID, the kernel's start time
of that PID (so a recycled PID is never mistaken for ours), ports, CPU set and every restart.
`netra status` and `netra stop` work from another shell from this file alone. Writes are atomic.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

RECORD_NAME = "launch.json"
RECORD_VERSION = 1


class RecordError(RuntimeError):
    pass


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces or parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    state = fields[0]
    if state in ("Z", "X"):  # a zombie has exited; only its parent's wait is missing
        return None
    return int(fields[19])


def is_alive(pid: int | None, ticks: int | None) -> bool:
    if not pid:
        return False
    now = proc_start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def record_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORD_NAME


def read_record(run_dir: str | Path) -> dict[str, Any]:
    path = record_path(run_dir)
    if not path.is_file():
        raise RecordError(f"no launch record at {path} (nothing was launched with this run dir)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise RecordError(f"launch record {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        raise RecordError(f"launch record {path} has an unknown format")
    return data


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
