"""Verification before anything starts: the profile lock, graph-bucket coverage, kernel code objects,
the SGLang plugin's tactic domains, images, checkpoint identity and the speculative drafter's identity
(`check_drafter`). Each problem is one line naming
its cause; any problem refuses the launch (`LaunchRefused`). Warnings are printed and recorded but
do not stop a non-strict launch.

The profile lock (`launcher/lock.json`) holds each committed profile's canonical sha256, so a profile
edited after it was locked is refused until someone re-locks it on purpose:
`netra plan --relock --profile NAME` (or `netra plan --relock` for every profile).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra import settings
from netra.deploy.profile import PROFILE_DIR, Profile, load_profile, netra_model_dir
from netra.kernel_lock import object_path
from netra.resources import DATA_ROOT, sha256_file

PROFILE_LOCK = PROFILE_DIR / "lock.json"
KERNEL_LOCK = DATA_ROOT / "kernels" / "lock.json"
LOCK_VERSION = 1


class LaunchRefused(RuntimeError):
    """The launch is refused; `problems` lists every cause (each names what is wrong)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("launch refused:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Code objects verified for this target: {"path", "sha256", "family", "name"} (the audit looks
    # for them in each worker's memory map).
    code_objects: list[dict[str, str]] = field(default_factory=list)
    # The speculative drafter as verified: {"path", "local", "config_sha256", "pinned_sha256", "revision"}
    # (config_sha256 null where it could not be read here: a Hugging Face repo id); None without speculation.
    drafter: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"problems": self.problems, "warnings": self.warnings, "code_objects": self.code_objects,
                "drafter": self.drafter}

    def raise_if_refused(self) -> None:
        if self.problems:
            raise LaunchRefused(self.problems)


# --- profile lock ---------------------------------------------------------------------------------

def read_profile_lock(path: Path = PROFILE_LOCK) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        profiles = data["profiles"]
        if data.get("version") != LOCK_VERSION or not isinstance(profiles, dict):
            raise ValueError("expected {\"version\": 1, \"profiles\": {name: sha256}}")
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchRefused([f"profile lock {path} is malformed: {exc}"]) from None
    return {str(k): str(v) for k, v in profiles.items()}


def write_profile_lock(names: list[str] | None = None, path: Path = PROFILE_LOCK) -> dict[str, str]:
    """(Re-)lock the named committed profiles (all when None); returns the lock's new content."""
    current = read_profile_lock(path) if path.is_file() else {}
    from netra.deploy.profile import list_profiles

    for name in names if names is not None else list_profiles():
        current[name] = load_profile(name).sha256()
    profiles = dict(sorted(current.items()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": LOCK_VERSION, "profiles": profiles}, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return profiles


def check_profile_lock(profile: Profile, v: Verification, *, strict: bool, path: Path = PROFILE_LOCK) -> None:
    locked = read_profile_lock(path).get(profile.name)
    now = profile.sha256()
    if locked is None:
        msg = (f"profile {profile.name!r} is not in the profile lock {path} "
               f"(lock it with `netra plan --relock --profile {profile.name}`)")
        (v.problems if strict else v.warnings).append(msg)
    elif locked != now:
        v.problems.append(f"profile {profile.name!r} was edited after its lock: {path} says sha256 {locked[:16]}..., "
                          f"the profile is now {now[:16]}... (review the change, then "
                          f"`netra plan --relock --profile {profile.name}`)")


# --- contract checks ------------------------------------------------------------------------------

def check_graph_buckets(profile: Profile, v: Verification) -> None:
    e = profile.engine
    if e.cuda_graph_bs and max(e.cuda_graph_bs) < e.max_running_requests:
        v.problems.append(
            f"graph buckets do not cover max running requests: engine.cuda_graph_bs tops out at "
            f"{max(e.cuda_graph_bs)} but engine.max_running_requests is {e.max_running_requests} "
            f"(batches above {max(e.cuda_graph_bs)} would leave the captured graphs)")
    if profile.uses_gpus and profile.strict and not e.cuda_graph_bs:
        v.problems.append(f"graph buckets do not cover max running requests: a strict GPU profile needs "
                          f"engine.cuda_graph_bs covering 1..{e.max_running_requests}")


def check_kernel_lock(profile: Profile, v: Verification, *, strict: bool, lock_path: Path = KERNEL_LOCK,
                      build_dir: Path | None = None) -> None:
    """Every code object the kernel lock lists for the profile's target exists with its sha256."""
    if not profile.uses_gpus:
        return
    build = Path(build_dir) if build_dir is not None else Path(settings.get("NETRA_BUILD_DIR"))
    if not lock_path.is_file():
        msg = (f"kernel lock {lock_path} is missing: no {profile.target} code objects can be verified "
               f"(run `netra kernels build`)")
        (v.problems if strict else v.warnings).append(msg)
        return
    try:
        data = json.loads(lock_path.read_text())
        entries = [e for e in data["code_objects"] if e["target"] == profile.target]
        for e in entries:
            str(e["code_object"]), str(e["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        v.problems.append(f"kernel lock {lock_path} is malformed: {type(exc).__name__}: {exc}")
        return
    if not entries:
        v.warnings.append(f"kernel lock {lock_path} has no {profile.target} code objects: every op runs "
                          f"on its fallback")
    for e in entries:
        path = object_path(e, build)
        label = f"{e.get('family', '?')}/{e.get('name', '?')}"
        if not path.is_file():
            v.problems.append(f"missing code object {path} ({label}, {profile.target}) listed in {lock_path}"
                              f" (run `netra kernels build`)")
            continue
        digest = sha256_file(path)
        if digest != e["sha256"]:
            v.problems.append(f"tampered code object {path} ({label}): sha256 {digest[:16]}..., "
                              f"{lock_path} says {str(e['sha256'])[:16]}...")
            continue
        v.code_objects.append({"path": str(path.resolve()), "sha256": digest, "family": str(e.get("family")),
                               "name": str(e.get("name"))})


def check_tactics(profile: Profile, v: Verification) -> None:
    """Every tactic domain the profile enables has a contract the plugin can load on its target."""
    from netra.plugins import sglang as plugin

    for name in plugin.enabled(profile.engine.tactics):
        if not plugin.selectable(name, profile.target):
            op = plugin.DOMAINS[name].op
            v.problems.append(f"engine.tactics enables {name}, but no {profile.target} contract for op {op} can be "
                              f"selected (kernels/{profile.target}: none built and accepted); the plugin would "
                              f"have nothing to load (set engine.tactics without {name}, or none)")


def check_images(profile: Profile, v: Verification, *, strict: bool) -> None:
    if profile.image is None and profile.engine.kind != "sglang":
        return
    try:
        from netra.deploy import images
    except ModuleNotFoundError as exc:
        if exc.name != "netra.deploy.images":
            raise
        msg = f"image lock check unavailable (netra.deploy.images missing): image {profile.image!r} unverified"
        (v.problems if strict else v.warnings).append(msg)
        return
    v.problems.extend(str(p) for p in images.check(profile, strict))


def check_checkpoint(profile: Profile, v: Verification, *, strict: bool) -> None:
    local = netra_model_dir(profile.engine)
    if local is not None and not (local / "config.json").is_file():
        v.problems.append(f"engine.model_path {local}: no checkpoint there (no config.json); write one with "
                          f"`netra checkpoint synth --preset {profile.engine.preset} --out {local}`, or name "
                          "another with --set engine.model_path=DIR")
        return
    want = profile.checkpoint.config_sha256
    path = str(local) if local is not None else profile.engine.model_path
    if want is None or path is None:
        if strict and profile.engine.model_path is not None and want is None:
            v.warnings.append(f"checkpoint {path}: no checkpoint.config_sha256 in the profile, identity unpinned")
        return
    config = Path(path) / "config.json"
    if not config.is_file():
        v.warnings.append(f"checkpoint {path}: not a local folder, config.json sha256 checked by the engine only")
        return
    got = sha256_file(config)
    if got != want:
        v.problems.append(f"checkpoint {config}: sha256 {got[:16]}..., the profile pins {want[:16]}...")


# A Hugging Face repo id (``name`` or ``owner/name``), as SGLang's loaders take one for a path that is not
# a folder here. Anything else that is not a folder (an absolute path, ``./x``, ``a/b/c``) names a missing one.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def drafter_dir(path: str) -> Path | None:
    """The drafter's local folder, or None where ``path`` is a Hugging Face repo id SGLang would download.

    SGLang reads a draft model path as a folder when one exists there and as a repo id otherwise; a path
    that cannot be a repo id (absolute, ``./``/``../``/``~``, more than one ``/``) is a folder even when
    it is missing, and then the launch is refused here rather than by SGLang after the target has loaded.
    """
    local = Path(path).expanduser()
    if path.startswith(("/", "./", "../", "~")) or local.exists():
        return local
    if _REPO_ID.fullmatch(path) and ".." not in path and "--" not in path:
        return None
    return local


def check_drafter(profile: Profile, v: Verification, *, strict: bool) -> None:
    """The speculative drafter is the one the profile pins (``engine.speculative.draft_config_sha256``).

    A local drafter folder must exist with a config.json whose sha256 is the pinned one; either failure
    refuses the launch, naming the drafter and both hashes. A drafter named by Hugging Face repo id cannot
    be read here (strict production nodes have no network), so it is treated as the target checkpoint is
    (`check_checkpoint`): a warning, in strict mode, that its identity is unpinned or checked only where
    the worker downloads it.
    """
    spec = profile.engine.speculative
    if spec is None or spec.algorithm == "NGRAM":  # NGRAM drafts from the prompt: no drafter checkpoint
        return
    want, path = spec.draft_config_sha256, spec.draft_model_path
    local = drafter_dir(path)
    v.drafter = {"path": path, "local": local is not None, "config_sha256": None, "pinned_sha256": want,
                 "revision": spec.draft_revision}
    if local is None:
        if not strict:
            return
        if want is None:
            v.warnings.append(f"drafter {path}: no engine.speculative.draft_config_sha256 in the profile, identity "
                              "unpinned")
        else:
            rev = spec.draft_revision or "main (no engine.speculative.draft_revision)"
            v.warnings.append(f"drafter {path}: a Hugging Face repo id, not a local folder; its config.json sha256 "
                              f"(pinned {want[:16]}...) is not checked before launch, SGLang downloads revision "
                              f"{rev}")
        return
    config = local / "config.json"
    if not config.is_file():
        what = "no such folder" if not local.is_dir() else "no config.json"
        v.problems.append(f"drafter {local} (engine.speculative.draft_model_path): no checkpoint there ({what}); "
                          f"the profile pins config.json sha256 {want or 'none'} (put the drafter there, or name "
                          "another with --set engine.speculative.draft_model_path=DIR)")
        return
    got = sha256_file(config)
    v.drafter["config_sha256"] = got
    if want is None:
        if strict:
            v.warnings.append(f"drafter {config}: sha256 {got}, not pinned (engine.speculative.draft_config_sha256),"
                              " identity unpinned")
    elif got != want:
        v.problems.append(f"drafter {config}: config.json sha256 {got}, the profile pins {want} "
                          f"(engine.speculative.draft_config_sha256): not the locked drafter (restore it, or "
                          f"review the new one, pin its hash and `netra plan --relock --profile {profile.name}`)")


def verify(profile: Profile, *, base: Profile | None = None, strict: bool | None = None,
           profile_lock: Path = PROFILE_LOCK, kernel_lock: Path = KERNEL_LOCK,
           build_dir: Path | None = None) -> Verification:
    """Run every pre-launch check; never raises for problems (see `Verification.raise_if_refused`).

    `profile` is what will run (with `--set` overrides applied); `base` is the profile as loaded from
    its file, whose hash the profile lock holds (the same object when there are no overrides).
    """
    s = profile.strict if strict is None else strict
    v = Verification()
    check_profile_lock(base if base is not None else profile, v, strict=s, path=profile_lock)
    check_graph_buckets(profile, v)
    check_kernel_lock(profile, v, strict=s, lock_path=kernel_lock, build_dir=build_dir)
    check_tactics(profile, v)
    check_images(profile, v, strict=s)
    check_checkpoint(profile, v, strict=s)
    check_drafter(profile, v, strict=s)
    if base is not None:
        check_drafter_overrides(base, profile, v)
    return v


def check_drafter_overrides(base: Profile, profile: Profile, v: Verification) -> None:
    """The drafter's pinned identity is part of the profile lock: `--set` may point the launch at another
    folder (whose config.json must still hash as pinned) or turn speculation off, never re-pin it."""
    was, now = base.engine.speculative, profile.engine.speculative
    if was is None or now is None:
        return
    for key in ("draft_config_sha256", "draft_revision"):
        if getattr(was, key) != getattr(now, key):
            v.problems.append(f"engine.speculative.{key}: --set changes the locked drafter identity "
                              f"({getattr(was, key)} -> {getattr(now, key)}); pin it in the profile and "
                              f"`netra plan --relock --profile {base.name}`")
