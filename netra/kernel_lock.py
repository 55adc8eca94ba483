"""The kernel lock (`kernels/lock.json`): which code objects exist, their hashes and build facts, and where
each lives. Read by the runtime that loads code objects and by the build that writes the lock, so neither
imports the other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from netra.resources import DATA_ROOT

LOCK_PATH = DATA_ROOT / "kernels" / "lock.json"
LOCK_VERSION = 1


class LockError(RuntimeError):
    """The kernel lock is missing, unreadable or of another version."""


def object_path(entry: dict[str, Any], build_dir: Path) -> Path:
    """Where a lock entry's code object lives: the build dir for cubins, the repository for Triton modules."""
    return (DATA_ROOT if entry.get("kind") == "triton" else build_dir) / entry["code_object"]


def read_lock(path: Path = LOCK_PATH) -> dict[str, Any]:
    try:
        lock: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LockError(f"kernel lock {path} unreadable: {exc}") from exc
    if lock.get("version") != LOCK_VERSION or not isinstance(lock.get("code_objects"), list):
        raise LockError(f"kernel lock {path}: expected version {LOCK_VERSION} with a code_objects list")
    return lock
