"""Result records (shared/design/RESULTS.md): one JSON object per measurement, written by the tool.

Both the kernel harness and the serving benchmark write through `write_record`, which checks the
required keys so that a malformed record never lands under results/.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from netra.resources import SOURCE_ROOT

REQUIRED_KEYS = ("kind", "family", "target", "device", "git_sha", "date", "command", "status", "rows",
                 "checks", "verdict")
KINDS = ("kernel", "serving")
VERDICTS = ("accepted", "rejected", "inconclusive", "info")
STATUSES = ("measured", "not_run")


class RecordError(ValueError):
    pass


def git_sha(repo: Path = SOURCE_ROOT) -> str:
    """Commit of the code measured, with a ``-dirty`` suffix when tracked files changed; NETRA_GIT_SHA names it
    where git cannot (a copy of the tree whose .git belongs to another commit)."""
    from netra import settings

    given = settings.get("NETRA_GIT_SHA")
    if given:
        return str(given)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_device() -> str:
    return f"cpu:{platform.machine()}:{platform.processor() or 'unknown'}"


def validate(record: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise RecordError(f"record misses required keys {missing}")
    if record["kind"] not in KINDS:
        raise RecordError(f"record kind {record['kind']!r} not in {KINDS}")
    if record["verdict"] not in VERDICTS:
        raise RecordError(f"record verdict {record['verdict']!r} not in {VERDICTS}")
    if record["status"] not in STATUSES:
        raise RecordError(f"record status {record['status']!r} not in {STATUSES}")
    if record["status"] == "not_run" and not record.get("reason"):
        raise RecordError("a not_run record needs a reason")
    if not isinstance(record["rows"], list) or not isinstance(record["checks"], dict):
        raise RecordError("rows must be a list and checks an object")


def write_record(record: dict[str, Any], directory: Path, stem: str) -> Path:
    """Validate and write ``<directory>/<stem>.json``; returns the path."""
    validate(record)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path
