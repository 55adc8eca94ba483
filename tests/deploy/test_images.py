"""The image lock: Dockerfiles pinned to the lock, profiles pointing at the right image, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from netra.deploy import images
from netra.deploy.profile import list_profiles, load_profile

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A private copy of images/ to edit (the committed files are never touched)."""
    shutil.copytree(REPO / "images", tmp_path / "images")
    return tmp_path


def _lock(root: Path) -> Path:
    return root / "images" / "lock.json"


def test_committed_lock_matches_every_dockerfile() -> None:
    assert images.lint() == []
    entries = images.load_lock()
    assert {e.dockerfile for e in entries.values()} == {
        "images/sglang-sm90.Dockerfile", "images/sglang-gfx950.Dockerfile", "images/netra-sm90.Dockerfile",
        "images/netra-cpu.Dockerfile"}
    by_target = {(e.target, e.engine): e for e in entries.values()}
    assert by_target[("sm90", "sglang")].reference == "lmsysorg/sglang:v0.5.23-cu130"
    assert by_target[("gfx950", "sglang")].reference.startswith("lmsysorg/sglang:v0.5.23-rocm")
    for e in entries.values():
        # Each Dockerfile builds FROM exactly what the lock pins (reference, plus @digest once resolved).
        assert images.from_lines(REPO / e.dockerfile) == [e.pinned_reference]


def test_upstream_digests_are_honestly_unresolved() -> None:
    # No registry is reachable from here: every upstream digest is recorded as unresolved, none guessed;
    # the GPU images are not built here either.
    gpu = sorted(n for n, e in images.load_lock().items() if e.target != "cpu")
    assert gpu == ["netra-engine-cuda-sm90", "netra-sglang-cuda-sm90", "netra-sglang-rocm-gfx950"]
    assert [n for n in images.unresolved() if n in gpu] == gpu
    assert all(images.load_lock()[n].built is None for n in gpu)


def test_the_cpu_image_builds_on_the_base_made_here() -> None:
    lock = images.read_lock()
    cpu = lock.images["netra-engine-cpu"]
    base = lock.bases[cpu.base or ""]
    assert (cpu.target, cpu.engine, cpu.reference, cpu.digest) == ("cpu", "netra", base.tag, base.id)
    assert (base.suite, base.variant) == ("bookworm", "minbase")
    assert images.from_lines(REPO / cpu.dockerfile) == ["${NETRA_BASE}"] == [cpu.pinned_reference]
    if cpu.built is not None:  # recorded by `netra images build` on the machine that built it
        assert cpu.built["base_id"] == base.id and cpu.built["dockerfile_sha256"] == cpu.dockerfile_sha256
        assert cpu.compose_image == cpu.built["id"]


def test_a_built_record_must_be_complete(tree: Path) -> None:
    data = json.loads(_lock(tree).read_text())
    data["images"]["netra-engine-cpu"]["built"] = {"id": DIGEST}
    _lock(tree).write_text(json.dumps(data))
    with pytest.raises(images.ImageLockError, match=r"netra-engine-cpu.built must be null or have exactly"):
        images.load_lock(_lock(tree))


def test_a_based_image_must_carry_its_base_id(tree: Path) -> None:
    data = json.loads(_lock(tree).read_text())
    data["images"]["netra-engine-cpu"]["digest"] = DIGEST
    _lock(tree).write_text(json.dumps(data))
    with pytest.raises(images.ImageLockError, match="builds on base debian-bookworm-minbase"):
        images.load_lock(_lock(tree))
    with pytest.raises(images.ImageLockError, match="made here"):
        images.pin("netra-engine-cpu", DIGEST, images.LOCK_PATH, REPO)


def test_every_profile_image_is_locked_and_matches() -> None:
    for name in list_profiles():
        p = load_profile(name)
        assert images.check(p, strict=False) == [], name
        if p.engine.kind == "sglang":
            entry = images.load_lock()[p.image or ""]
            assert (entry.target, entry.engine) == (p.target, "sglang")


@pytest.mark.parametrize("name", ["dp8-throughput128", "dp8-h200-throughput128"])
def test_strict_launch_refuses_unresolved_digest(name: str) -> None:
    problems = images.check(load_profile(name), strict=True)
    assert len(problems) == 1
    assert "unresolved" in problems[0] and load_profile(name).image in problems[0]


def test_image_not_in_lock() -> None:
    p = load_profile("dp8-h200-throughput128").replace("image", "netra-sglang-cuda-sm100")
    (msg,) = images.check(p, strict=False)
    assert "'netra-sglang-cuda-sm100'" in msg and "not in the image lock" in msg


def test_sglang_profile_without_image() -> None:
    p = load_profile("dp8-h200-throughput128").replace("image", None)
    (msg,) = images.check(p, strict=False)
    assert "names no image" in msg


def test_embedded_profile_without_image_has_nothing_to_check() -> None:
    assert images.check(load_profile("dp1-h200"), strict=True) == []


def test_image_for_another_target_or_engine_is_a_mismatch() -> None:
    h200 = load_profile("dp8-h200-throughput128")
    (msg,) = images.check(h200.replace("image", "netra-sglang-rocm-gfx950"), strict=False)
    assert "built for gfx950" in msg and "targets sm90" in msg and "mismatched reference" in msg
    (msg,) = images.check(h200.replace("image", "netra-engine-cuda-sm90"), strict=False)
    assert "carries the netra engine" in msg and "runs sglang" in msg


def test_edited_dockerfile_is_refused_until_relocked(tree: Path) -> None:
    df = tree / "images" / "sglang-sm90.Dockerfile"
    df.write_text(df.read_text() + "RUN echo edited\n")
    p = load_profile("dp8-h200-throughput128")
    problems = images.check(p, strict=False, path=_lock(tree), root=tree)
    assert len(problems) == 1 and "sglang-sm90.Dockerfile sha256" in problems[0]
    assert images.relock(_lock(tree), tree) == ["netra-sglang-cuda-sm90"]
    assert images.check(p, strict=False, path=_lock(tree), root=tree) == []


def test_dockerfile_from_another_image_is_a_mismatch(tree: Path) -> None:
    df = tree / "images" / "sglang-sm90.Dockerfile"
    df.write_text(df.read_text().replace("FROM lmsysorg/sglang:v0.5.23-cu130", "FROM lmsysorg/sglang:latest"))
    images.relock(_lock(tree), tree)  # a matching sha256 does not hide a wrong base
    problems = images.lint(_lock(tree), tree)
    assert problems == ["image netra-sglang-cuda-sm90: images/sglang-sm90.Dockerfile builds FROM "
                        "'lmsysorg/sglang:latest' but the image lock pins 'lmsysorg/sglang:v0.5.23-cu130' "
                        "(mismatched reference)"]


def test_build_arg_from_is_not_a_pin(tree: Path) -> None:
    df = tree / "images" / "netra-sm90.Dockerfile"
    df.write_text("ARG BASE=lmsysorg/sglang:v0.5.23-cu130\nFROM ${BASE}\n")
    images.relock(_lock(tree), tree)
    (msg,) = images.lint(_lock(tree), tree)
    assert "build argument, not a pin" in msg


def test_unlocked_dockerfile_is_flagged(tree: Path) -> None:
    (tree / "images" / "vllm-sm90.Dockerfile").write_text("FROM vllm/vllm-openai:v0.26.0\n")
    (msg,) = images.lint(_lock(tree), tree)
    assert "images/vllm-sm90.Dockerfile is not in the image lock" in msg


def test_pin_rewrites_from_and_satisfies_strict(tree: Path) -> None:
    entry = images.pin("netra-sglang-cuda-sm90", DIGEST, _lock(tree), tree)
    assert entry.resolved and entry.digest == DIGEST
    df = tree / "images" / "sglang-sm90.Dockerfile"
    assert images.from_lines(df) == [f"lmsysorg/sglang:v0.5.23-cu130@{DIGEST}"]
    assert images.lint(_lock(tree), tree) == []
    p = load_profile("dp8-h200-throughput128")
    assert images.check(p, strict=True, path=_lock(tree), root=tree) == []
    # The other images stay unresolved: pinning one never touches another.
    assert [n for n in images.unresolved(_lock(tree)) if "cpu" not in n] == [
        "netra-engine-cuda-sm90", "netra-sglang-rocm-gfx950"]
    with pytest.raises(images.ImageLockError, match="not sha256"):
        images.pin("netra-sglang-cuda-sm90", "sha256:xyz", _lock(tree), tree)


def test_pin_with_a_corrected_reference(tree: Path) -> None:
    ref = "lmsysorg/sglang:v0.5.23-rocm724-mi35x"
    entry = images.pin("netra-sglang-rocm-gfx950", DIGEST, _lock(tree), tree, reference=ref)
    assert (entry.reference, entry.pinned_reference) == (ref, f"{ref}@{DIGEST}")
    assert images.from_lines(tree / "images" / "sglang-gfx950.Dockerfile") == [f"{ref}@{DIGEST}"]
    assert images.lint(_lock(tree), tree) == []
    with pytest.raises(images.ImageLockError, match="without a digest"):
        images.pin("netra-sglang-rocm-gfx950", DIGEST, _lock(tree), tree, reference=f"{ref}@{DIGEST}")


@pytest.mark.parametrize(("edit", "named"), [
    (lambda e: e.update(registry="docker.io"), "unknown key images.netra-sglang-cuda-sm90.registry"),
    (lambda e: e.pop("digest"), "missing key images.netra-sglang-cuda-sm90.digest"),
    (lambda e: e.update(digest="sha256:1234"), "images.netra-sglang-cuda-sm90.digest"),
    (lambda e: e.update(target="sm100"), "images.netra-sglang-cuda-sm90.target"),
    (lambda e: e.update(reference="lmsysorg/sglang@" + DIGEST), "carries a digest"),
])
def test_malformed_lock_names_the_key(tree: Path, edit, named: str) -> None:
    data = json.loads(_lock(tree).read_text())
    edit(data["images"]["netra-sglang-cuda-sm90"])
    _lock(tree).write_text(json.dumps(data))
    with pytest.raises(images.ImageLockError, match="image lock") as info:
        images.load_lock(_lock(tree))
    assert named in str(info.value)
    p = load_profile("dp8-h200-throughput128")
    # A profile check on a malformed lock is a problem (a refusal), not a crash.
    assert named in images.check(p, strict=False, path=_lock(tree), root=tree)[0]


def test_cli_lint_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert images.main(["lint"]) == 0
    assert "unresolved" in capsys.readouterr().out
    assert images.main(["pin", "no-such-image", DIGEST]) == 2


def test_dockerfiles_pass_hadolint() -> None:
    dockerfiles = sorted((REPO / "images").glob("*.Dockerfile"))
    assert len(dockerfiles) == 4
    assert images.hadolint(dockerfiles) == []


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM lmsysorg/sglang:latest\nRUN cd /opt && pip install netra\n")
    findings = images.hadolint([bad])
    joined = "\n".join(findings)
    assert "DL3007" in joined  # FROM ...:latest
    assert "DL3003" in joined  # cd instead of WORKDIR
    assert "DL3013" in joined  # unpinned pip install
