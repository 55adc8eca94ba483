"""`netra images base | wheelhouse | build | lint | relock | pin`: images built through the Docker SDK.

* ``base [NAME]``: makes a base image here with ``debootstrap --variant=VARIANT SUITE`` from the
  Debian registry and ``docker import``; records its image ID in the lock's ``bases`` (nothing is done
  when the engine already holds the locked ID).
* ``wheelhouse``: ``pip download`` of what the images install (pyproject's core dependencies and the
  ``engine`` + ``serve`` extras, written as ``requirements/image.txt`` in the build context) at the
  versions of ``requirements/constraints.txt`` + ``cpu.txt``, into
  ``$NETRA_CACHE_DIR/wheelhouse/<sha256 of those>``, with the CPU torch wheel forced by a constraint
  (``torch==X+cpu``) and checked: no CUDA torch, no ``nvidia-*`` wheel. Reused while they are unchanged.
* ``build [NAME...]``: assembles the build context (package, requirement files, profiles, nginx
  template, kernel contracts + lock, and the code objects from ``$NETRA_BUILD_DIR``, refused unless
  each matches the kernel lock), builds it with the Docker SDK (the classic builder, host network so
  that apt reaches the Debian registry; the wheelhouse is served to the build on loopback, so no
  wheel stays in a layer), checks that the image sits on the locked base's layers, and records in
  the lock the image ID, its base ID, the sha256 of its Dockerfile, context and wheelhouse. An entry
  whose recorded inputs are unchanged and whose image the engine holds is not rebuilt.

With no Docker engine each verb says what is missing and how to get it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from netra import settings
from netra.deploy import images as il
from netra.resources import sha256_file
from netra.settings import REPO_ROOT

# The pins every install uses (pip -c), and the pyproject extras an image installs (with the core).
CONSTRAINTS = ("requirements/constraints.txt", "requirements/cpu.txt")
IMAGE_EXTRAS = ("engine", "serve")
IMAGE_REQUIREMENTS = "requirements/image.txt"  # written into the build context only
# What every image's context holds (relative to the repository root); build/ is added separately.
# (requirements/image.txt is written, not copied: the image installs from the wheelhouse only.)
CONTEXT_PATHS = ("pyproject.toml", "launcher", "nginx", "kernels", "netra")
SKIP_NAMES = {"__pycache__", ".mypy_cache", ".pytest_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".tmp")
# Build containers get a quarter of the default CPU weight: the machine is shared.
BUILD_LIMITS = {"cpushares": 256}
ENGINE_HELP = ("install Docker Engine (Debian: `apt-get install docker.io`) and start it (`dockerd &`), "
               "or point DOCKER_HOST at one")


class ImageBuildError(RuntimeError):
    """A build input or the Docker engine is missing or wrong; the message names it."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def client() -> Any:
    """A Docker SDK client that answered a ping (API version negotiated with the engine)."""
    try:
        import docker
    except ImportError:
        raise ImageBuildError("the Docker SDK for Python is not installed (PyPI `docker`, in the `deploy` "
                              "extra: `make setup`, or pip install 'netra[deploy]')") from None
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        c = docker.from_env(version="auto", timeout=600)
        c.ping()
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"no Docker engine answers at {where} ({exc}); {ENGINE_HELP}") from None
    return c


def image_id(c: Any, ref: str) -> str | None:
    """The engine's image ID for a tag or an ID, None if it holds no such image."""
    import docker

    try:
        return str(c.images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def tree_sha256(root: Path) -> str:
    """sha256 over every file under root: relative path, executable bit and content sha256, sorted."""
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        mode = "x" if os.access(path, os.X_OK) else "-"
        lines.append(f"{path.relative_to(root).as_posix()}\0{mode}\0{sha256_file(path)}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- base -----------------------------------------------------------------------------------------


def make_base(name: str | None = None, *, path: Path | None = None, force: bool = False) -> il.BaseEntry:
    """Make (or find) the base image `name` and record its ID in the lock."""
    lock = il.read_lock(path)
    if name is None:
        if len(lock.bases) != 1:
            raise ImageBuildError(f"name a base: the image lock has {sorted(lock.bases) or 'none'}")
        name = next(iter(lock.bases))
    if name not in lock.bases:
        raise ImageBuildError(f"base {name!r} is not in the image lock (bases: {sorted(lock.bases)})")
    base = lock.bases[name]
    c = client()
    if not force and base.id != il.UNRESOLVED and image_id(c, base.id) == base.id:
        c.images.get(base.id).tag(*base.tag.rsplit(":", 1))
        _log(f"base {name}: the engine holds the locked image {base.id} ({base.tag})")
        return base
    debootstrap = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists()
                                                  else None)
    if debootstrap is None:
        raise ImageBuildError("debootstrap is not installed (Debian: `apt-get install debootstrap`)")
    cache = Path(settings.get("NETRA_CACHE_DIR"))
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=cache) as tmp:
        rootfs = Path(tmp) / "rootfs"
        argv = [debootstrap, f"--variant={base.variant}", base.suite, str(rootfs), base.mirror]
        _log(f"base {name}: {' '.join(argv)}")
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ImageBuildError(f"debootstrap failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        # Package caches and lists are not part of the base (images run `apt-get update` themselves).
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / sub).glob("*"):
                if item.is_file():
                    item.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        repo, tag = base.tag.rsplit(":", 1)
        c.api.import_image_from_file(str(tarball), repository=repo, tag=tag)
        new_id = image_id(c, base.tag)
        if new_id is None:
            raise ImageBuildError(f"docker import of {base.tag} left no image")
        _log(f"base {name}: {base.tag} = {new_id} ({time.monotonic() - t0:.0f} s)")
    made = replace(base, id=new_id, created=now_utc())
    record_base(made, path)
    return made


def record_base(base: il.BaseEntry, path: Path | None = None) -> None:
    """Write a base's ID into the lock, and into every image built on it (reference/digest)."""
    lock = il.read_lock(path)
    entries = {n: (replace(e, reference=base.tag, digest=base.id) if e.base == base.name else e)
               for n, e in lock.images.items()}
    il.write_lock(entries, path, bases={**lock.bases, base.name: base})


# --- wheelhouse -------------------------------------------------------------------------------------


def _cpu_constraints(requirement_files: list[Path]) -> list[str]:
    """Every `torch==X` pin as `torch==X+cpu` (kept if it says so already): pip then cannot resolve to a
    CUDA build."""
    out = []
    for f in requirement_files:
        for line in f.read_text().splitlines():
            spec = line.split("#", 1)[0].strip()
            if spec.lower().startswith("torch=="):
                out.append(spec if "+" in spec else f"{spec}+cpu")
    return out


def check_wheelhouse(folder: Path) -> list[str]:
    """What makes a wheelhouse unfit for a CPU image (empty: fit)."""
    names = sorted(p.name for p in folder.glob("*.whl"))
    torch = [n for n in names if n.lower().startswith("torch-")]
    problems = []
    if len(torch) != 1 or "+cpu" not in torch[0]:
        problems.append(f"the wheelhouse needs exactly one CPU torch wheel (torch-X+cpu), it has {torch}")
    problems += [f"{n}: a CUDA wheel has no place in a CPU image" for n in names if n.lower().startswith("nvidia")]
    return problems


def image_requirements(root: Path = REPO_ROOT) -> str:
    """pyproject's core dependencies plus the image extras (``netra[x]`` expanded), one per line."""
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    todo, seen = list(IMAGE_EXTRAS), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for req in extras[extra]:
            if req.replace(" ", "").startswith("netra["):
                todo += [x.strip() for x in req.split("[", 1)[1].rstrip("]").split(",")]
            elif req not in out:
                out.append(req)
    return "".join(f"{r}\n" for r in out)


def wheelhouse(root: Path = REPO_ROOT) -> tuple[Path, str]:
    """(folder, sha256) of the wheelhouse for the image requirements, downloaded once and reused."""
    files = [root / r for r in CONSTRAINTS]
    wanted = image_requirements(root)
    key = hashlib.sha256(wanted.encode() + b"".join(f.read_bytes() for f in files)).hexdigest()
    folder = Path(settings.get("NETRA_CACHE_DIR")) / "wheelhouse" / key[:16]
    manifest = folder / "SHA256SUMS"
    if not manifest.is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=folder.parent))
        try:
            (tmp / "constraints.txt").write_text("\n".join(_cpu_constraints(files)) + "\n")
            (tmp / "image.txt").write_text(wanted)
            argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                    "--only-binary=:all:", "-d", str(tmp), "-r", str(tmp / "image.txt"),
                    "-c", str(tmp / "constraints.txt")]
            for f in files:
                argv += ["-c", str(f)]
            _log(f"wheelhouse: pip download into {folder}")
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ImageBuildError(f"pip download failed: {proc.stderr.strip()[-2000:]}")
            (tmp / "constraints.txt").unlink()
            (tmp / "image.txt").unlink()
            problems = check_wheelhouse(tmp)
            if problems:
                raise ImageBuildError("; ".join(problems))
            sums = "".join(f"{sha256_file(p)}  {p.name}\n" for p in sorted(tmp.glob("*.whl")))
            (tmp / "SHA256SUMS").write_text(sums)
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
            # Keep this wheelhouse and the one before it (a branch switch back reuses it); drop older ones.
            others = sorted((d for d in folder.parent.iterdir() if d.is_dir() and not d.name.startswith(".")
                             and d != folder), key=lambda d: d.stat().st_mtime)
            for old in others[:-1]:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return folder, hashlib.sha256(manifest.read_bytes()).hexdigest()


@contextmanager
def serve_folder(folder: Path, port: int = 0) -> Iterator[str]:
    """An HTTP file server for `folder` on 127.0.0.1 while the block runs: on `port` when it is free
    (the URL is a build argument, part of the build cache key, so a stable one keeps the cache), else
    on any free port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# --- build ------------------------------------------------------------------------------------------


def code_objects_for(entry: il.ImageEntry, kernel_lock: dict[str, Any]) -> list[dict[str, Any]]:
    """The kernel-lock entries an image carries: its own target's; the cpu image carries all of them
    (it runs none, and carries them so that the container-start verify and the audit run here as they
    do in the sm90 image)."""
    return [e for e in kernel_lock["code_objects"] if entry.target == "cpu" or e["target"] == entry.target]


def assemble_context(entry: il.ImageEntry, ctx: Path, *, root: Path = REPO_ROOT,
                     build_dir: Path | None = None) -> str:
    """Fill `ctx` with what the image's Dockerfile copies; returns the context's sha256.

    Refuses (ImageBuildError) when a code object the image carries is missing from the build dir or
    differs from the kernel lock."""
    from netra.contract import expand
    from netra.kernel_lock import read_lock

    build = Path(build_dir) if build_dir is not None else Path(settings.get("NETRA_BUILD_DIR"))
    kernel_lock = read_lock(root / "kernels" / "lock.json")
    carried = code_objects_for(entry, kernel_lock)
    problems = []
    for e in carried:
        # A cubin comes from the build dir; a Triton module is pinned by its source in the repository.
        src = (root if e.get("kind") == "triton" else build) / e["code_object"]
        if not src.is_file():
            problems.append(f"missing code object {src} ({e['family']}/{e['name']})")
        elif sha256_file(src) != e["sha256"]:
            problems.append(f"code object {src} ({e['family']}/{e['name']}) differs from kernels/lock.json")
    if problems:
        raise ImageBuildError(f"refusing to build {entry.name}: the code objects in {build} do not match the "
                              f"kernel lock (run `netra kernels build`, or set NETRA_BUILD_DIR):\n  - "
                              + "\n  - ".join(problems))
    ignore = shutil.ignore_patterns(*SKIP_NAMES, *(f"*{s}" for s in SKIP_SUFFIXES), "*.egg-info")
    for rel in CONTEXT_PATHS:
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, ctx / rel, ignore=ignore)
        else:
            shutil.copy2(src, ctx / rel)
    # The result records (and notes) that the contracts cite, each variant's included: the catalog refuses an
    # accepted contract whose evidence is not on disk.
    for contract in sorted((root / "kernels").rglob("*.contract.json")):
        cited = {rel for doc in expand(json.loads(contract.read_text()), contract) for rel in doc.get("evidence") or []}
        for rel in sorted(cited):
            if (root / rel).is_file() and not (ctx / rel).exists():
                (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, ctx / rel)
    (ctx / "build").mkdir()
    for e in carried:
        triton = e.get("kind") == "triton"
        dst = (ctx if triton else ctx / "build") / e["code_object"]
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2((root if triton else build) / e["code_object"], dst)
    (ctx / IMAGE_REQUIREMENTS).parent.mkdir(parents=True, exist_ok=True)
    (ctx / IMAGE_REQUIREMENTS).write_text(image_requirements(root))
    shutil.copy2(root / entry.dockerfile, ctx / "Dockerfile")
    return tree_sha256(ctx)


def _uses_wheelhouse(dockerfile: Path) -> bool:
    return "NETRA_WHEELHOUSE_URL" in dockerfile.read_text()


def _run_build(c: Any, ctx: Path, entry: il.ImageEntry, buildargs: dict[str, str],
               log: Callable[[str], None]) -> None:
    stream = c.api.build(path=str(ctx), dockerfile="Dockerfile", tag=entry.tag, buildargs=buildargs,
                         network_mode="host", rm=True, forcerm=True, decode=True, container_limits=BUILD_LIMITS,
                         labels={"org.netra.image": entry.name})
    tail: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            raise ImageBuildError(f"docker build of {entry.name} failed: {chunk['error'].strip()}\n"
                                  + "".join(tail[-30:]))
        text = chunk.get("stream")
        if text:
            tail.append(text)
            if text.startswith("Step ") or text.startswith("Successfully"):
                log(text.rstrip())


def build(name: str, *, path: Path | None = None, root: Path = REPO_ROOT, build_dir: Path | None = None,
          log: Callable[[str], None] = _log) -> il.ImageEntry:
    """Build the image `name` (unless its recorded build is current) and record it in the lock."""
    lock = il.read_lock(path)
    if name not in lock.images:
        raise ImageBuildError(f"image {name!r} is not in the image lock (locked: {sorted(lock.images)})")
    entry = lock.images[name]
    problems = il.lint_entry(entry, root)
    if problems:
        raise ImageBuildError("; ".join(problems))
    c = client()
    buildargs: dict[str, str] = {}
    base_id = entry.digest
    if entry.base is not None:
        if image_id(c, entry.digest) != entry.digest:
            raise ImageBuildError(f"image {name} builds on the base {entry.base} ({entry.digest}), which this "
                                  f"engine does not hold: run `netra images base {entry.base}` first")
        buildargs[il.BASE_ARG] = entry.digest
    dockerfile = root / entry.dockerfile
    wheel_sha = ""
    house: Path | None = None
    if _uses_wheelhouse(dockerfile):
        house, wheel_sha = wheelhouse(root)
        buildargs["NETRA_WHEELHOUSE_SHA256"] = wheel_sha
    with tempfile.TemporaryDirectory(prefix="ctx-", dir=_scratch()) as tmp:
        ctx = Path(tmp)
        ctx_sha = assemble_context(entry, ctx, root=root, build_dir=build_dir)
        done = entry.built
        if (done and done["context_sha256"] == ctx_sha and done["dockerfile_sha256"] == entry.dockerfile_sha256
                and done["base_id"] == base_id and done["wheelhouse_sha256"] == wheel_sha
                and image_id(c, done["id"]) == done["id"]):
            # The tag may have moved (a build recorded in another lock, e.g. the tests' copy): it names
            # the recorded image again, as the launch requires.
            c.images.get(done["id"]).tag(*entry.tag.rsplit(":", 1))
            log(f"image {name}: up to date ({done['id']}, context {ctx_sha[:16]}; {entry.tag} points at it)")
            return entry
        log(f"image {name}: building {entry.tag} from {entry.dockerfile} (context {ctx_sha[:16]})")
        t0 = time.monotonic()
        if house is not None:
            with serve_folder(house, 20000 + int(wheel_sha[:8], 16) % 20000) as url:
                _run_build(c, ctx, entry, {**buildargs, "NETRA_WHEELHOUSE_URL": url}, log)
        else:
            _run_build(c, ctx, entry, buildargs, log)
    img = c.images.get(entry.tag)
    if entry.base is not None:
        base_layers = c.images.get(entry.digest).attrs["RootFS"]["Layers"]
        if img.attrs["RootFS"]["Layers"][: len(base_layers)] != base_layers:
            raise ImageBuildError(f"image {name} ({img.id}) does not sit on the layers of its base {entry.digest}")
    if entry.base is None:  # an upstream FROM: the ID of what the build pulled for the pinned reference
        base_id = image_id(c, entry.pinned_reference) or ""
    built = {"id": str(img.id), "base_id": base_id,
             "dockerfile_sha256": entry.dockerfile_sha256, "context_sha256": ctx_sha,
             "wheelhouse_sha256": wheel_sha, "engine": f"Docker Engine {c.version().get('Version', '?')}",
             "size": int(img.attrs.get("Size", 0)), "created": str(img.attrs.get("Created", ""))[:19] + "Z"}
    new = replace(entry, built=built)
    lock = il.read_lock(path)  # re-read: another entry may have been recorded meanwhile
    il.write_lock({**lock.images, name: new}, path)
    size_mb = int(img.attrs.get("Size", 0)) / 1e6
    log(f"image {name}: {img.id} ({size_mb:.0f} MB, {time.monotonic() - t0:.0f} s); recorded in "
        f"{path or il.lock_path()}")
    return new


def _scratch() -> Path:
    folder = Path(settings.get("NETRA_CACHE_DIR")) / "contexts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- CLI ----------------------------------------------------------------------------------------------


def register(sub: Any) -> None:
    from netra.cli import add_verb

    parser = add_verb(sub, "images")
    parser.set_defaults(func=il.run)  # lint | relock | pin
    verbs = il.add_arguments(parser)
    b = verbs.add_parser("base", help="debootstrap + docker import the lock's base image; record its ID")
    b.add_argument("name", nargs="?", help="base name in the lock (default: the only one)")
    b.add_argument("--force", action="store_true", help="make it again even if the engine holds the locked ID")
    b.set_defaults(func=_cmd_base)
    w = verbs.add_parser("wheelhouse", help="download the CPU image's Python wheels once (cached)")
    w.set_defaults(func=_cmd_wheelhouse)
    b = verbs.add_parser("build", help="build images with the Docker SDK and record their IDs in the lock")
    b.add_argument("names", nargs="*", help="lock names (default: every image built on a base made here)")
    b.set_defaults(func=_cmd_build)


def _guard(fn: Callable[[], None]) -> int:
    try:
        fn()
    except (ImageBuildError, il.ImageLockError) as exc:
        print(f"netra images: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_base(args: argparse.Namespace) -> int:
    return _guard(lambda: print(asdict(make_base(args.name, force=args.force))["id"]))


def _cmd_wheelhouse(args: argparse.Namespace) -> int:
    return _guard(lambda: print("{} sha256 {}".format(*wheelhouse())))


def _cmd_build(args: argparse.Namespace) -> int:
    def run() -> None:
        names = args.names or sorted(n for n, e in il.load_lock().items() if e.base is not None)
        for n in names:
            e = build(n)
            print(f"{n} {e.built_id}")

    return _guard(run)
