"""Build hook: the wheel carries Netra's data files under netra/_data (netra/resources.py).

Everything else about the package is declared in pyproject.toml. The files copied are the globs of
``[tool.netra] package-data`` there, plus every kernel source a contract names and every result
record an accepted contract cites as evidence (the catalog refuses an accepted contract without it).
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def data_files() -> list[Path]:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["netra"]["package-data"]
    files: set[Path] = set()
    for pattern in globs:
        matched = [p for p in ROOT.glob(pattern) if p.is_file()]
        if not matched:
            raise SystemExit(f"setup.py: package-data glob {pattern!r} matches no file")
        files.update(matched)
    for contract in ROOT.glob("kernels/*/*/*.contract.json"):
        doc = json.loads(contract.read_text())
        for source in _sources(doc):  # every kernel source a contract names (cubin or Triton module)
            if (ROOT / source).is_file():
                files.add(ROOT / source)
        for maturity, cited in cited_evidence(doc):
            path = ROOT / cited
            if path.is_file():
                files.add(path)
            elif maturity == "accepted":
                raise SystemExit(f"setup.py: accepted contract {contract} cites {cited}, which does not exist")
    return sorted(files)


def cited_evidence(doc: dict[str, object]) -> list[tuple[object, str]]:
    """(maturity, evidence path) of each contract a file declares: the file's own, or each of its
    ``variants`` (merge patches on the file: a variant's top-level evidence and maturity replace the file's)."""
    variants = doc.get("variants")
    members = [doc | v for v in variants] if isinstance(variants, list) else [doc]
    return [(m.get("maturity"), e) for m in members for e in m.get("evidence", [])]  # type: ignore[attr-defined]


def _sources(doc: object) -> list[str]:
    if isinstance(doc, dict):
        found = [v for k, v in doc.items() if k == "source" and isinstance(v, str)]
        return found + [s for v in doc.values() for s in _sources(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _sources(v)]
    return []


class build_py_with_data(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout itself
        dest = Path(self.build_lib) / "netra" / "_data"
        for path in data_files():
            target = dest / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import data_files()
    setup(cmdclass={"build_py": build_py_with_data})
