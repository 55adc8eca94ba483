"""What a hooked SGLang process reports about itself, and how the launcher reads it back (stdlib only).

Every process that runs the plugin (SGLang loads plugins in its HTTP server, scheduler and
detokenizer processes) keeps one `Recorder` and, when ``NETRA_PLUGIN_EVIDENCE`` names a directory
(the launcher sets ``<run dir>/worker<i>.plugin``), writes ``<pid>.json`` there:

* ``hooks``: per enabled domain, its SGLang target, ``registered`` (the plugin asked SGLang's
  ``HookRegistry`` for an AROUND hook) and ``applied`` (the target attribute in this process now
  wraps Netra's hook, seen by walking its ``__wrapped__`` chain);
* ``tactics``: every code object loaded in this process (its name in the kernel lock, family, the op
  of the contract that loaded it, sha256 of the bytes loaded, device), from
  `netra.runtime.loaded_tactics`;
* ``counts``: per domain, hits and misses with the reason of each miss. A hook runs in Python, so it
  counts eager calls and CUDA-graph captures; a graph replay runs no Python and is not counted;
* ``error``: why the plugin could not do what the profile asked (a bad domain name, a prepare that
  raised), or null.

The file is rewritten atomically when something new happens (a hook applied, a tactic loaded, a
miss reason seen for the first time) and otherwise at most every `FLUSH_S` seconds, and at exit.
``pid`` and ``ticks`` (the process's start time) let the audit keep only files written by live
processes of the worker it audits.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

EVIDENCE_VERSION = 1
PLUGIN_NAME = "netra"
FLUSH_S = 2.0
# Distinct miss reasons kept per domain; further ones are counted under OTHER (a reason that names a
# call's token count would otherwise grow without bound over prefill lengths).
MAX_REASONS = 64
OTHER = "(other reasons)"

log = logging.getLogger("netra.plugins")


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _loaded_tactics() -> list[dict[str, Any]]:
    """Code objects loaded in this process (only if the runtime was ever imported: no import here)."""
    runtime = sys.modules.get("netra.runtime")
    if runtime is None:
        return []
    out = []
    for (name, device), t in sorted(runtime.loaded_tactics().items()):  # one entry per code object
        family = t.obj.family if getattr(t, "obj", None) is not None else t.contract.family
        out.append({"name": name, "family": family, "op": t.contract.op, "sha256": t.sha256, "device": device})
    return out


class Recorder:
    """This process's hooks, hit/miss counts and loaded tactics; `snapshot()` is the evidence record."""

    def __init__(self, domains: tuple[str, ...], directory: Path | None) -> None:
        self.domains = domains
        self.directory = directory
        self.pid = os.getpid()
        self.hooks: dict[str, dict[str, Any]] = {}
        self.counts: dict[str, dict[str, Any]] = {d: {"hits": 0, "misses": 0, "miss_reasons": {}} for d in domains}
        self.prepared: dict[str, str] = {}
        self.error: str | None = None
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._dirty = False
        if directory is not None:
            atexit.register(self.flush, True)

    # --- events ------------------------------------------------------------------------------------

    def _count(self, domain: str) -> dict[str, Any]:
        return self.counts.setdefault(domain, {"hits": 0, "misses": 0, "miss_reasons": {}})

    def hook(self, domain: str, **fields: Any) -> None:
        with self._lock:
            self.hooks.setdefault(domain, {}).update(fields)
        self.flush(force=True)

    def hit(self, domain: str) -> None:
        with self._lock:
            self._count(domain)["hits"] += 1
            self._dirty = True
        self.flush()

    def miss(self, domain: str, reason: str) -> None:
        with self._lock:
            c = self._count(domain)
            c["misses"] += 1
            reasons = c["miss_reasons"]
            new = reason not in reasons
            if new and len(reasons) >= MAX_REASONS:
                reason, new = OTHER, OTHER not in reasons
            reasons[reason] = reasons.get(reason, 0) + 1
            self._dirty = True
        if new:
            log.info("netra plugin %s: SGLang's original runs (%s)", domain, reason)
        self.flush(force=new)

    def set_prepared(self, domain: str, outcome: str) -> None:
        with self._lock:
            self.prepared[domain] = outcome
        self.flush(force=True)

    def fail(self, message: str) -> None:
        with self._lock:
            self.error = message if self.error is None else f"{self.error}; {message}"
        log.error("netra plugin: %s", message)
        self.flush(force=True)

    # --- the record --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": EVIDENCE_VERSION, "plugin": PLUGIN_NAME, "pid": self.pid,
                "ticks": _start_ticks(self.pid), "argv": list(sys.argv[:3]),
                "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "domains": list(self.domains),
                "error": self.error, "hooks": json.loads(json.dumps(self.hooks)),
                "prepared": dict(self.prepared), "counts": json.loads(json.dumps(self.counts)),
                "tactics": _loaded_tactics(),
            }

    def flush(self, force: bool = False) -> None:
        """Write ``<pid>.json`` now if ``force``, else only when dirty and `FLUSH_S` has passed."""
        if self.directory is None:
            return
        now = time.monotonic()
        if not force and (not self._dirty or now - self._last_write < FLUSH_S):
            return
        self._last_write, self._dirty = now, False
        try:
            write(self.directory, self.snapshot())
        except OSError as exc:  # evidence must never take the worker down; the audit sees it missing
            log.warning("netra plugin: cannot write evidence to %s: %s", self.directory, exc)


def write(directory: Path, record: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['pid']}.json"
    tmp = directory / f".{record['pid']}.{threading.get_ident()}.json.tmp"  # the watcher thread writes too
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def read(directory: Path) -> list[dict[str, Any]]:
    """Every evidence record in ``directory`` (unreadable or foreign files are skipped)."""
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("version") == EVIDENCE_VERSION and rec.get("plugin") == PLUGIN_NAME:
            rec["_path"] = str(path)
            out.append(rec)
    return out
