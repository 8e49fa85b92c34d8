"""The prepared experiments (docs/experiments/*.patch) still apply to this tree.

A patch that no longer applies costs a device call: tools/device_patches.sh drops its side and the
call measures main alone. Each patch is checked on its own, and the pairs that docs/experiments/
README.md says apply together are applied one after the other to a copy of the files they touch.
No GPU and no build: plain `git apply`.
"""

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "docs" / "experiments"
PATCHES = sorted(EXPERIMENTS.glob("*.patch"))
# The pairs docs/experiments/README.md names as applying together (device_patches.sh's "a+b" sides).
TOGETHER = [("andor", "deepring"), ("int4half8", "xahead")]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def touched(patch: pathlib.Path) -> list[str]:
    """The tree's paths a patch edits (its `--- a/` lines; new files have none)."""
    paths = re.findall(r"^--- a/(\S+)$", patch.read_text(), flags=re.M)
    return sorted(set(paths))


def git_apply(patch: pathlib.Path, cwd: pathlib.Path, check: bool) -> subprocess.CompletedProcess:
    args = ["git", "apply"] + (["--check"] if check else []) + [str(patch)]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True)


def test_the_experiments_directory_has_patches():
    assert PATCHES, f"no patches under {EXPERIMENTS}"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_each_patch_applies(patch, tmp_path):
    files = touched(patch)
    assert files, f"{patch.name}: no file edited"
    for f in files:
        assert (ROOT / f).is_file(), f"{patch.name} edits {f}, which this tree lacks"
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    r = git_apply(patch, tmp_path, check=True)
    assert r.returncode == 0, f"{patch.name} no longer applies:\n{r.stderr}"


@pytest.mark.parametrize("pair", TOGETHER, ids=["+".join(p) for p in TOGETHER])
def test_pairs_apply_together(pair, tmp_path):
    patches = [EXPERIMENTS / f"{name}.patch" for name in pair]
    for p in patches:
        assert p.is_file(), f"{p.name} is gone: update TOGETHER here and docs/experiments/README.md"
    for f in sorted(set(sum((touched(p) for p in patches), []))):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    for p in patches:
        r = git_apply(p, tmp_path, check=False)
        assert r.returncode == 0, f"{'+'.join(pair)}: {p.name} does not apply after the ones before it:\n{r.stderr}"
