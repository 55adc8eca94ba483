"""The image builder's offline parts (no Docker engine needed): the engine error, the wheelhouse checks,
the context hash, the refusal of code objects that differ from the kernel lock, and the container-start
verify. The engine itself is exercised in test_docker.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from netra.deploy import entry, imagebuild
from netra.deploy import images as il
from netra.kernel_lock import read_lock

REPO = Path(__file__).resolve().parents[2]


def test_no_engine_names_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(imagebuild.ImageBuildError) as err:
        imagebuild.client()
    msg = str(err.value)
    assert f"no Docker engine answers at unix://{tmp_path}/no-docker.sock" in msg
    assert "apt-get install docker.io" in msg and "dockerd" in msg


def test_the_wheelhouse_takes_only_the_cpu_torch(tmp_path: Path) -> None:
    assert imagebuild._cpu_constraints([REPO / "requirements" / "cpu.txt"]) == ["torch==2.13.0+cpu"]
    for name in ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.4.6-cp311-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert imagebuild.check_wheelhouse(tmp_path) == []
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").unlink()
    (tmp_path / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (tmp_path / "nvidia_cublas_cu12-12.8.4.1-py3-none-manylinux_2_27_x86_64.whl").write_bytes(b"")
    problems = imagebuild.check_wheelhouse(tmp_path)
    assert len(problems) == 2
    assert "exactly one CPU torch wheel" in problems[0] and "torch-2.13.0-cp311" in problems[0]
    assert problems[1].startswith("nvidia_cublas_cu12-12.8.4.1") and "CUDA wheel" in problems[1]


def test_tree_hash_covers_path_content_and_exec_bit(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    f = tmp_path / "a" / "x.py"
    f.write_text("print(1)\n")
    first = imagebuild.tree_sha256(tmp_path)
    assert imagebuild.tree_sha256(tmp_path) == first
    f.chmod(0o755)
    assert imagebuild.tree_sha256(tmp_path) != first
    f.chmod(0o644)
    assert imagebuild.tree_sha256(tmp_path) == first
    f.rename(tmp_path / "a" / "y.py")
    assert imagebuild.tree_sha256(tmp_path) != first


def _fake_build(tmp_path: Path) -> Path:
    """A build dir with files at the locked paths (their bytes are not the locked ones)."""
    build = tmp_path / "build"
    for e in read_lock()["code_objects"]:
        if e.get("kind") != "triton":
            (build / e["code_object"]).parent.mkdir(parents=True, exist_ok=True)
            (build / e["code_object"]).write_bytes(b"not the locked bytes")
    return build


def test_a_build_is_refused_when_code_objects_differ_from_the_kernel_lock(tmp_path: Path) -> None:
    entry_ = il.load_lock()["netra-engine-cpu"]
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    with pytest.raises(imagebuild.ImageBuildError) as err:
        imagebuild.assemble_context(entry_, ctx, build_dir=_fake_build(tmp_path))
    msg = str(err.value)
    first = read_lock()["code_objects"][0]
    assert msg.startswith("refusing to build netra-engine-cpu: the code objects in")
    assert f"{first['code_object']} ({first['family']}/{first['name']}) differs from kernels/lock.json" in msg
    assert list(ctx.iterdir()) == []  # nothing was assembled
    shutil.rmtree(tmp_path / "build")
    with pytest.raises(imagebuild.ImageBuildError, match="missing code object"):
        imagebuild.assemble_context(entry_, ctx, build_dir=tmp_path / "build")


def test_container_start_refuses_tampered_code_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NETRA_BUILD_DIR", str(_fake_build(tmp_path)))
    assert entry.main(["--", "netra", "engine", "--preset", "tiny"]) == entry.REFUSED
    err = capsys.readouterr().err
    first = read_lock()["code_objects"][0]
    assert "netra: refusing to start ['netra', 'engine', '--preset']" in err
    assert f"{first['name']}: " in err and "sha256" in err
    assert entry.main([]) == 2
