"""The SGLang peer loader: real files, stubs, refs, prebuilt JIT lookup, manifests vs the pinned wheel.

The finder is process-global, so each scenario runs in a fresh interpreter over a small fake
``sglang`` tree written to tmp_path (no torch, no triton, no GPU needed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from netra.bench.peers import sglang_loader as L

REPO = Path(__file__).resolve().parents[2]

FAKE_TREE = {
    "sglang/kernels/ops/demo.py": """
        from sglang.srt.utils import is_cuda, get_device_name
        import sglang.srt.layers_stub_pkg
        from sgl_kernel import fast_sum
        CUDA = is_cuda()
        def total(xs):
            return fast_sum(xs)
        def name():
            return get_device_name()
    """,
    "sglang/kernels/ops/slow.py": """
        def py_sum(xs):
            return sum(xs) + 1000
    """,
    "sglang/kernels/jit/utils/__init__.py": """
        class _Arch:
            major, minor, suffix = 9, 0, "a"
        def get_jit_cuda_arch():
            return _Arch()
        def load_jit(*args, **kw):
            raise AssertionError("the real load_jit must be replaced in run mode")
    """,
    "sglang/kernels/jit/utils/compile/spec.py": """
        _MODULE_NAME_PREFIX = "sgl_kernel_jit_"
    """,
    "sglang/kernels/ops/uses_jit.py": """
        from sglang.kernels.jit.utils import load_jit
        def module():
            return load_jit("demo", "bf16_t", "true", cuda_files=["x/demo.cuh"],
                            cuda_wrappers=[("run", "Demo<bf16_t, true>::run")])
        def module_other_flags():
            return load_jit("demo", "bf16_t", "true", cuda_files=["x/demo.cuh"],
                            cuda_wrappers=[("run", "Demo<bf16_t, true>::run")], extra_cuda_cflags=["-G"])
        def missing():
            return load_jit("absent", "x")
    """,
}
MANIFEST_SRC = """
from netra.bench.peers.sglang_loader import Manifest
MANIFEST = Manifest(
    "demo",
    ("sglang.kernels.ops.demo", "sglang.kernels.ops.slow", "sglang.kernels.ops.uses_jit",
     "sglang.kernels.jit.utils", "sglang.kernels.jit.utils.compile.spec"),
    stubs={"sglang.srt.utils": {"is_cuda": lambda: True}},
    refs={"sgl_kernel": {"fast_sum": ("sglang.kernels.ops.slow:py_sum", "no AOT here: the Python sum ran")}},
    wheels={"json-not-a-wheel": "json"},
)
"""


def _tree(tmp: Path) -> Path:
    root = tmp / "root"
    for rel, src in FAKE_TREE.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(src))
    (tmp / "demo_manifest.py").write_text(MANIFEST_SRC)
    return root


def _run(tmp: Path, body: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {str(tmp)!r})\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_real_stub_and_ref_modules(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    r = _run(tmp_path, f"""
        import importlib, sys
        from netra.bench.peers import sglang_loader as L
        L.install({str(root)!r}, manifest_list=[__import__("demo_manifest").MANIFEST])
        demo = importlib.import_module("sglang.kernels.ops.demo")
        assert demo.__file__.startswith({str(root)!r}), demo.__file__
        assert demo.CUDA is True                       # explicit stub value
        assert demo.total([1, 2]) == 1003              # ref -> the real slow.py, noted once
        assert demo.total([1]) == 1001
        try:
            demo.name()                                # unknown stub attribute: raises when called
        except NotImplementedError as e:
            assert "get_device_name" in str(e)
        else:
            raise AssertionError("stub did not raise")
        ran = [n for n in L.NOTES if n.startswith("ran sglang.kernels.ops.slow:py_sum")]
        assert len(ran) == 1 and "no AOT here" in ran[0], L.NOTES
        assert any(n.startswith("stub sglang.srt.utils.get_device_name") for n in L.NOTES), L.NOTES
        assert type(sys.modules["sglang.srt.layers_stub_pkg"]).__name__ == "_StubModule"
        try:
            L.install("/elsewhere", manifest_list=[])
        except RuntimeError as e:
            assert "already installed" in str(e)
        else:
            raise AssertionError("a second root was accepted")
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_prebuilt_jit_lookup(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    jit = root / "jit"
    jit.mkdir()
    req = L.jit_request(("demo", "bf16_t", "true"), {"cuda_files": ["x/demo.cuh"],
                                                     "cuda_wrappers": [("run", "Demo<bf16_t, true>::run")]})
    (jit / "MANIFEST.json").write_text(json.dumps({"modules": {"sgl_kernel_jit_demo_bf16_t_true": {
        "file": "sgl_kernel_jit_demo_bf16_t_true.so", "request": req, "target": "sm_90a"}}}))
    r = _run(tmp_path, f"""
        import importlib, sys, types
        fake = types.ModuleType("tvm_ffi")
        fake.load_module = lambda path: ("loaded", path)
        sys.modules["tvm_ffi"] = fake
        from netra.bench.peers import sglang_loader as L
        L.install({str(root)!r}, manifest_list=[__import__("demo_manifest").MANIFEST])
        uj = importlib.import_module("sglang.kernels.ops.uses_jit")
        tag, path = uj.module()
        assert tag == "loaded" and path.endswith("jit/sgl_kernel_jit_demo_bf16_t_true.so"), path
        for fn, word in ((uj.module_other_flags, "prebuilt for"), (uj.missing, "not prebuilt")):
            try:
                fn()
            except RuntimeError as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(fn.__name__ + " was accepted")
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_missing_files_and_conflicts_are_errors(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "sglang/kernels/ops/slow.py").unlink()
    r = _run(tmp_path, f"""
        from netra.bench.peers import sglang_loader as L
        try:
            L.install({str(root)!r}, manifest_list=[__import__("demo_manifest").MANIFEST])
        except FileNotFoundError as e:
            assert "sglang.kernels.ops.slow" in str(e)
            print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    a = L.Manifest("a", ("sglang.x",))
    b = L.Manifest("b", (), stubs={"sglang.x": {"f": 1}})
    with pytest.raises(ValueError, match="both real and stubbed"):
        L.merge([a, b])
    with pytest.raises(ValueError, match="disagree"):
        L.merge([L.Manifest("c", (), stubs={"sglang.y": {"f": 1}}), L.Manifest("d", (), stubs={"sglang.y": {"f": 2}})])


def test_stage_files_copies_modules_and_data(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "sglang/configs").mkdir(parents=True)
    (root / "sglang/configs/c.json").write_text("{}")
    plan = L.merge([L.Manifest("m", ("sglang.kernels.ops.demo", "sglang.kernels.jit.utils"),
                               files=("sglang/configs/c.json",))])
    rels = L.stage_files(tmp_path / "dest", plan, src=root)
    assert rels == ["sglang/configs/c.json", "sglang/kernels/jit/utils/__init__.py", "sglang/kernels/ops/demo.py"]
    for rel in rels:
        assert (tmp_path / "dest" / rel).read_text() == (root / rel).read_text()
    assert (tmp_path / "dest/sglang/kernels/jit/csrc/README").is_file()


def test_peer_manifests_resolve_in_the_pinned_wheel() -> None:
    """Every module, data file and JIT getter the registered peers name exists in sglang 0.5.23."""
    try:
        root = L.wheel_root()
    except Exception as exc:  # installed with --no-deps by `make setup`
        pytest.skip(f"the pinned sglang wheel is not installed: {exc}")
    plan = L.merge(L.manifests())
    for name in sorted(plan.modules):
        L.module_file(root, name)
    for rel in plan.files:
        assert (root / rel).is_file(), rel
    for jb in plan.jit:
        assert f"def {jb.getter}(" in L.module_file(root, jb.module).read_text(), jb


def test_a_missing_wheel_is_noted_not_fatal(tmp_path: Path) -> None:
    """The wheels are every peer's: one a peer does not need and this Python cannot have is a note."""
    (tmp_path / "wheels").mkdir()
    before = len(L.NOTES)
    L.ensure_wheels(tmp_path, {"json-is-there==1": "json", "no-such-peer-pkg==1.0": "no_such_peer_pkg"})
    assert L.NOTES[before:] == [f"no_such_peer_pkg not importable and no no-such-peer-pkg==1.0 wheel under "
                                f"{tmp_path / 'wheels'}"]
