"""Every guide runs top to bottom (offline stand-ins, smoke sizes) on every backend it names,
in an empty folder, as a user who installed the package with pip would run it."""

import glob
import os
import re
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_figures  # noqa: E402
import run_guides  # noqa: E402

GUIDES = sorted(glob.glob(os.path.join(ROOT, "guides", "*.md")))


@pytest.mark.backend_independent
def test_readme_guides_section_lists_exactly_the_guides_that_exist():
    import re

    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("\n## Guides\n", 1)[1].split("\n## ", 1)[0]  # other sections link guides too
    listed = re.findall(r"\]\((guides/\d\d_\w+\.md)\)", section)
    assert listed == [os.path.relpath(g, ROOT) for g in GUIDES]


# Every (guide, backend) pair CI runs: the backends a guide's **Backends:** line names, or the one its
# **CI runs it on:** line names where its code is the same on each. CI runs pytest once per backend
# (KERAS_BACKEND), so each pair runs in exactly one pass and is skipped in the others.
GUIDE_BACKENDS = [(guide, backend) for guide in GUIDES for backend in run_guides.ci_backends(open(guide).read())]


@pytest.mark.backend_independent
def test_every_guide_names_its_backends():
    for guide in GUIDES:
        named = run_guides.backends(open(guide).read())
        assert named and set(named) <= set(run_guides.BACKENDS), f"{guide}: {named}"


@pytest.mark.backend_independent
def test_a_guide_runs_on_fewer_backends_only_where_its_code_is_the_same_on_each():
    for guide in GUIDES:
        text = open(guide).read()
        named, checked = run_guides.backends(text), run_guides.ci_backends(text)
        assert checked and set(checked) <= set(named), f"{guide}: CI runs it on {checked}, it names {named}"
        if run_guides.branches_on_backend(text):
            assert checked == named, f"{guide} does different things per backend: CI must run it on each"
    branching = "**Backends:** jax, torch\n**CI runs it on:** jax\n```python\nif keras.backend.backend() == 'jax':\n    pass\n```\n"
    assert run_guides.branches_on_backend(branching) and run_guides.ci_backends(branching) == ["jax"]


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


@pytest.mark.backend_independent
def test_needs_block_without_stand_in_is_an_error():
    text = "**Backends:** jax\n**Hardware:** CPU\n```python needs=download\nx = 1\n```\n"
    with pytest.raises(SystemExit, match="needs a following 'stand-in' block"):
        run_guides.plan(text, "guide.md")
    text += "```python stand-in\nx = 2\n```\n"
    assert [code for _, code, _ in run_guides.plan(text, "guide.md")] == ["x = 2\n"]


@pytest.mark.backend_independent
def test_every_guide_imports_keras_vit_before_keras():
    """Keras takes TensorFlow when KERAS_BACKEND is unset, and fails where only [jax] or [torch] is installed;
    `import keras_vit` first picks the installed backend (CI runs each first block so, in a [jax]-only venv)."""
    import re

    keras_import = re.compile(r"^(?:import|from) keras(?:[\s.]|$)", re.MULTILINE)
    backend_chosen = re.compile(r"^(?:import|from) keras_vit\b|^os\.environ\[\"KERAS_BACKEND\"\] =", re.MULTILINE)
    for guide in GUIDES:
        code = "".join(code for language, code, _ in run_guides.plan(open(guide).read(), guide) if language == "python")
        keras, chosen = keras_import.search(code), backend_chosen.search(code)
        assert keras is None or (chosen and chosen.start() < keras.start()), f"{guide} imports keras first"


@pytest.mark.backend_independent
def test_first_block_mode_runs_only_the_first_python_block_and_skips_a_guide_without_its_backend(
        tmp_path, monkeypatch, capsys):
    guide = tmp_path / "guide.md"
    guide.write_text("**Backends:** jax\n**Hardware:** CPU\n```bash\nexit 1\n```\n"
                     "```python\nprint('set-up ran')\n```\n```python\nraise SystemExit('a later block ran')\n```\n")
    run_guides.main(str(guide), first=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"--- {guide}:6 (python, at ") and lines[1] == "set-up ran", lines
    assert re.fullmatch(rf"ok {re.escape(str(guide))} in \d+\.\d s", lines[2]), lines
    monkeypatch.setattr(run_guides.importlib.util, "find_spec", lambda name: None)
    run_guides.main(str(guide), first=True)
    assert capsys.readouterr().out == f"skip {guide}: its **Backends:** line names jax, none of them installed\n"


@pytest.mark.backend_independent
def test_every_documented_figure_is_what_its_recorded_run_printed():
    """Each figure marked in README.md, guides/ and docs/ equals docs/figures.json's measured value at the
    text's precision (a range: the lowest to the highest run), and every recorded figure is marked somewhere.
    The runs themselves are `tools/check_figures.py --run`'s (full size, minutes): not CI's."""
    assert check_figures.problems() == []


@pytest.mark.backend_independent
def test_figure_check_reports_a_figure_that_drifted_from_its_runs():
    marks = check_figures.marked_figures(
        "top-1 97.78%<!-- figure a --> and `0.9417`<!-- figure b -->\nfrom 0.23-0.32<!-- figure c -->", "doc.md")
    assert [mark[:4] for mark in marks] == [("a", "97.78", None, True), ("b", "0.9417", None, False),
                                            ("c", "0.23", "0.32", False)]
    measured = {"a": {"tensorflow": "0.9778"}, "b": {"jax": "0.9417"}, "c": {"jax": "0.2301", "torch": "0.3249"}}
    assert check_figures.compare(marks, measured) == []
    measured = {"a": {"tensorflow": "0.9722"}, "b": {"jax": "0.94166"}, "c": {"jax": "0.2451", "torch": "0.3249"}}
    assert check_figures.compare(marks, measured) == [
        "doc.md:1: a says 97.78%, the runs printed 0.9722 (tensorflow)",
        "doc.md:2: c says 0.23-0.32, the runs printed 0.2451 (jax), 0.3249 (torch): "
        "a range must run from the lowest to the highest"]
    several = check_figures.marked_figures("elsewhere 20-26%<!-- figure d e -->", "doc.md")
    assert check_figures.compare(several, {"d": {"torch": "0.2"}, "e": {"torch": "0.2556"}}) == []
    assert check_figures.compare(several, {"d": {"torch": "0.2"}, "e": {"torch": "0.3"}}) == [
        "doc.md:1: d e says 20-26%, the runs printed 0.2 (d, torch), 0.3 (e, torch): "
        "a range must run from the lowest to the highest"]
    assert check_figures.compare(marks[:1], {}) == [
        "doc.md:1: figure a was never measured (python tools/check_figures.py --run JOB --record)"]
    assert check_figures.marked_figures("an example: `97.78%<!-- figure a -->`", "doc.md") == []
    with pytest.raises(SystemExit, match="must follow its figure"):
        check_figures.marked_figures("about half<!-- figure a -->", "doc.md")


@pytest.mark.backend_independent
def test_figure_check_reads_each_named_figure_from_a_run_and_refuses_a_changed_output():
    job = check_figures.Job("python x.py", ("jax",), ((check_figures.TOP1, (None, "top1")),))
    output = "Epoch 1/2\rloss 0.1\ntop-1 accuracy: 0.5000\ntop-1 accuracy: 0.9778\n"
    assert check_figures.read_figures(job, output) == {"top1": "0.9778"}
    with pytest.raises(SystemExit, match="matched 1 values in the output, the job names 2"):
        check_figures.read_figures(job, "top-1 accuracy: 0.9778\n")
