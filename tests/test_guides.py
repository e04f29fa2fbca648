"""Every guide runs top to bottom (offline stand-ins, smoke sizes) on every backend it names,
in an empty folder, as a user who installed the package with pip would run it."""

import glob
import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import run_guides  # noqa: E402

GUIDES = sorted(glob.glob(os.path.join(ROOT, "guides", "*.md")))


def test_readme_lists_exactly_the_guides_that_exist():
    import re

    listed = re.findall(r"\]\((guides/\d\d_\w+\.md)\)", open(os.path.join(ROOT, "README.md")).read())
    assert listed == [os.path.relpath(g, ROOT) for g in GUIDES]
    assert len(GUIDES) == 9


# Every (guide, backend) pair a guide's **Backends:** line names. CI runs pytest once per backend
# (KERAS_BACKEND), so each pair runs in exactly one pass and is skipped in the others.
GUIDE_BACKENDS = [(guide, backend) for guide in GUIDES for backend in run_guides.backends(open(guide).read())]


def test_every_guide_names_its_backends():
    for guide in GUIDES:
        named = run_guides.backends(open(guide).read())
        assert named and set(named) <= set(run_guides.BACKENDS), f"{guide}: {named}"


@pytest.mark.parametrize("guide, backend", GUIDE_BACKENDS,
                         ids=[f"{os.path.basename(g)}-{b}" for g, b in GUIDE_BACKENDS])
def test_guide_runs_as_a_pip_user_would(guide, backend, tmp_path):
    """The guide runs top to bottom in an empty folder (no examples/, no repository files) with the
    installed package and its `keras-vit` command, on every backend it names."""
    if keras.backend.backend() != backend:
        pytest.skip(f"runs in the {backend} pass")
    bin_dir = os.path.dirname(sys.executable)  # where pip put the `keras-vit` command
    env = {**os.environ, "KERAS_BACKEND": backend, "KERAS_VIT_GUIDE_SMOKE": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    assert os.path.exists(os.path.join(bin_dir, "keras-vit")), "the keras-vit console script is not installed"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "run_guides.py"), guide], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_needs_block_without_stand_in_is_an_error():
    text = "**Backends:** jax\n**Hardware:** CPU\n```python needs=download\nx = 1\n```\n"
    with pytest.raises(SystemExit, match="needs a following 'stand-in' block"):
        run_guides.plan(text, "guide.md")
    text += "```python stand-in\nx = 2\n```\n"
    assert [code for _, code, _ in run_guides.plan(text, "guide.md")] == ["x = 2\n"]
