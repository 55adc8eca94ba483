"""Where Netra's data files are, and where it writes: one place, so a wheel and a checkout agree.

Data (profiles, the nginx template, the image lock, kernel contracts, their schema and the records
that accepted contracts cite) is read from the source checkout when Netra runs from one (an
editable install, `make setup`), and otherwise from the copy the wheel ships in ``netra/_data``
(setup.py copies the paths listed under ``[tool.netra.package-data]`` in pyproject.toml, plus every
accepted contract's evidence). Both have the same layout, so ``data_path("launcher", "local.yaml")``
is right in either.

What Netra writes never goes into the package: launch records and logs default to ``run/`` of the
checkout, or to ``$XDG_STATE_HOME/netra/run`` (``~/.local/state/netra/run``) for an installed
package; code objects to ``build/`` of the checkout, or ``$XDG_CACHE_HOME/netra/build``.
``NETRA_RUN_DIR`` and ``NETRA_BUILD_DIR`` (netra/settings.py) override both.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = _PACKAGE_DIR.parent
# The directory of `launcher/`, `nginx/`, `images/`, `kernels/` (and cited `results/` records).
PACKAGED = "_data"


class DataMissing(FileNotFoundError):
    """A data file Netra needs is not where the checkout or the wheel would have it."""


def is_checkout() -> bool:
    """True when `netra` is imported from a source tree (the package's parent holds pyproject.toml
    and launcher/), false for an installed wheel."""
    return (SOURCE_ROOT / "pyproject.toml").is_file() and (SOURCE_ROOT / "launcher").is_dir()


def _packaged_root() -> Path:
    root = resources.files("netra") / PACKAGED
    # The wheel is installed unzipped (pip always does): the traversable is a real directory.
    return Path(str(root))


def data_root() -> Path:
    """The directory that holds Netra's data files (see the module docstring)."""
    return SOURCE_ROOT if is_checkout() else _packaged_root()


def data_path(*parts: str) -> Path:
    return data_root().joinpath(*parts)


def require_data(*parts: str) -> Path:
    """``data_path(*parts)``, or `DataMissing` naming where it was looked for."""
    path = data_path(*parts)
    if not path.exists():
        where = "the source checkout" if is_checkout() else "the installed package (netra/_data)"
        raise DataMissing(f"{'/'.join(parts)} is missing from {where}: looked at {path}; reinstall netra "
                          "(a wheel built by setup.py ships it)")
    return path


def require_checkout(what: str) -> Path:
    """The checkout root, for commands that rewrite tracked files (locks, schemas)."""
    if not is_checkout():
        raise DataMissing(f"{what} rewrites files of a source checkout; run it from a clone of the "
                          f"repository (this netra is installed at {_PACKAGE_DIR})")
    return SOURCE_ROOT


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    base = Path(value) if value and Path(value).is_absolute() else Path.home() / fallback
    return base / "netra"


def default_run_dir() -> Path:
    return SOURCE_ROOT / "run" if is_checkout() else _xdg("XDG_STATE_HOME", ".local/state") / "run"


def default_build_dir() -> Path:
    return SOURCE_ROOT / "build" if is_checkout() else _xdg("XDG_CACHE_HOME", ".cache") / "build"


DATA_ROOT = data_root()


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
