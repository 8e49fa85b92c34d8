"""The prepared experiments (docs/experiments/*.patch) still apply to this tree.

A patch that no longer applies costs a device call: tools/device_patches.sh drops its side and the
call measures main alone. Each patch is checked on its own, and the pairs that
docs/experiments/README.md says apply together are applied one after the other to a copy of the
files they touch. No GPU and no build: plain `git apply`.
"""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "docs" / "experiments"
PATCHES = sorted(EXPERIMENTS.glob("*.patch"))
# The pairs docs/experiments/README.md names as applying together (device_patches.sh's "a+b" sides).
TOGETHER: list[tuple[str, str]] = [("xsscale", "xsmbar")]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def touched(patch: pathlib.Path) -> list[str]:
    """The tree's paths a patch edits (its `--- a/` lines; new files have none)."""
    paths = re.findall(r"^--- a/(\S+)$", patch.read_text(), flags=re.M)
    return sorted(set(paths))


def apply_in_order(names: list[str], tmp_path: pathlib.Path) -> None:
    """Copies the files the patches touch into tmp_path and applies them there one after the other."""
    patches = [EXPERIMENTS / f"{name}.patch" for name in names]
    for p in patches:
        assert p.is_file(), f"{p.name} is gone: update TOGETHER here and docs/experiments/README.md"
    for p in patches:
        assert touched(p), f"{p.name}: no file edited"
    for f in sorted(set(sum((touched(p) for p in patches), []))):
        assert (ROOT / f).is_file(), f"{'+'.join(names)} edits {f}, which this tree lacks"
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    # Outside any repository (a repository above tmp_path would make git apply skip the paths
    # outside its working directory, silently), and each patch must change what it touches.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    for i, p in enumerate(patches):
        before = {f: (tmp_path / f).read_bytes() for f in touched(p)}
        r = subprocess.run(["git", "apply", str(p)], cwd=tmp_path, capture_output=True, text=True, env=env)
        after = f" after {'+'.join(names[:i])}" if i else ""
        assert r.returncode == 0, f"{p.name} no longer applies{after}:\n{r.stderr}"
        assert any((tmp_path / f).read_bytes() != b for f, b in before.items()), f"{p.name} changed nothing"


def test_the_experiments_directory_has_patches():
    assert PATCHES, f"no patches under {EXPERIMENTS}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_each_patch_applies(patch, tmp_path):
    apply_in_order([patch.stem], tmp_path)


@pytest.mark.parametrize("pair", TOGETHER, ids=["+".join(p) for p in TOGETHER])
def test_pairs_apply_together(pair, tmp_path):
    apply_in_order(list(pair), tmp_path)


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs sha256sum")
def test_side_key_follows_the_built_sources(tmp_path):
    """tools/side_key.sh decides whether a prebuilt side (tools/prebuild_sides.sh) may stand for a
    tree on the device: the same sources give the same key, an edit to what the build compiles or
    installs gives another, and what it neither compiles nor installs (tests, tools) changes nothing."""
    def key(tree):
        return subprocess.run(["bash", str(ROOT / "tools" / "side_key.sh"), str(tree)], check=True,
                              capture_output=True, text=True).stdout.strip()

    tree = tmp_path / "tree"
    for part in ("ffi", "jaxgemv", "CMakeLists.txt", "pyproject.toml"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tree / part)
    (tree / "tests").mkdir()
    first = key(tree)
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert key(tree) == first
    (tree / "tests" / "test_new.py").write_text("x = 1\n")
    (tree / "jaxgemv" / "__pycache__").mkdir(exist_ok=True)
    (tree / "jaxgemv" / "__pycache__" / "planner.cpython-312.pyc").write_bytes(b"\0")
    assert key(tree) == first
    for edited in ("ffi/common.h", "jaxgemv/planner.py", "CMakeLists.txt"):
        path = tree / edited
        text = path.read_text()
        path.write_text(text + "\n")
        assert key(tree) != first, edited
        path.write_text(text)
        assert key(tree) == first, edited
