"""Every environment variable Netra reads, with its type and meaning (one place, typed).

A malformed value is an error that names the variable; nothing here is read on a launch path.
Add a variable by adding one `Setting` to `SETTINGS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netra.resources import DATA_ROOT, default_build_dir, default_run_dir

# TRANSITIONAL alias for branches that still read data relative to the repository: it is the data
# root (the checkout, or the wheel's netra/_data); new code uses netra.resources.
REPO_ROOT = DATA_ROOT


class SettingError(ValueError):
    pass


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    meaning: str

    def read(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        if self.type is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise SettingError(f"{self.name}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
        try:
            return self.type(raw)
        except (TypeError, ValueError) as exc:
            raise SettingError(f"{self.name}={raw!r}: expected {self.type.__name__} ({self.meaning})") from exc


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("NETRA_BUILD_DIR", Path, default_build_dir(),
                "where `netra kernels build` writes code objects (default: build/ of the checkout, or "
                "$XDG_CACHE_HOME/netra/build)"),
        Setting("NETRA_RUN_DIR", Path, default_run_dir(),
                "launch records, logs, benchmark work dirs and their records (default: run/ of the "
                "checkout, or $XDG_STATE_HOME/netra/run)"),
        Setting("NETRA_LOG_LEVEL", str, "INFO", "logging level of netra processes"),
        Setting("NETRA_LOG_FORMAT", str, "text", "log lines as text or json (one object per line)"),
        Setting("NETRA_DISABLE_TACTICS", bool, False, "force every op onto its fallback (A/B control arm)"),
        Setting("NETRA_NO_PDL", bool, False, "launch every tactic without programmatic dependent launch, whatever "
                "its contract says (a control arm for races between adjacent kernels)"),
        Setting("NETRA_GDN_PREFILL", str, "fla", "GDN prefill on CUDA: fla (fla-core's chunk_gated_delta_rule) or "
                "reference (the PyTorch reference)"),
        Setting("NETRA_ATTN_PREFILL", str, "sdpa", "attention prefill on CUDA where no contract serves it: sdpa "
                "(PyTorch's fused scaled_dot_product_attention, FlashAttention-class memory) or reference (the "
                "FP32 reference: a chunk x prefix score matrix per sequence)"),
        Setting("NETRA_IMAGE_LOCK", Path, REPO_ROOT / "images" / "lock.json",
                "the image lock that `netra images build` writes and launches check"),
        Setting("NETRA_CACHE_DIR", Path, Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "netra",
                "reusable derived files: the image wheelhouse, the converted Qwen3.6 tokenizer and synthesized "
                "checkpoints (netra/checkpoint/)"),
        Setting("NETRA_REQUIRE_DOCKER", bool, False, "tests marked docker fail instead of skipping without an engine (CI)"),
        Setting("NETRA_GIT_SHA", str, "", "the commit a record names when the tree has no usable git (a device copy: "
                "its .git is not the tree's); empty: `git rev-parse HEAD` of the source tree"),
        Setting("NETRA_TACTIC_MIN_MATURITY", str, "accepted", "lowest contract maturity dispatch selects (experiment|verified|accepted)"),
        Setting("NETRA_SGLANG_TACTICS", str, "", "tactic domains Netra's SGLang plugin hooks in this worker (comma list of moe, argmax; empty: none)"),
        Setting("NETRA_PLUGIN_EVIDENCE", Path, None, "directory where each SGLang process running Netra's plugin writes <pid>.json (hooks, code objects, hits)"),
    )
}


def run_dir() -> Path:
    """Where launches, benchmark work dirs and (by default) result records go."""
    return Path(get("NETRA_RUN_DIR"))


def records_dir() -> Path:
    """The default record directory of every measuring tool: `$NETRA_RUN_DIR/records`. A record is
    kept in the repository only when the tool's --out / --results-dir names results/ explicitly."""
    return run_dir() / "records"


def get(name: str) -> Any:
    try:
        setting = SETTINGS[name]
    except KeyError as exc:
        raise SettingError(f"unknown setting {name!r}; known: {sorted(SETTINGS)}") from exc
    return setting.read()
