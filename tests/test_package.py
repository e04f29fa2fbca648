"""The package's shape: imports run one way, and every module stays readable."""

import ast
import os

import pytest

import keras_vit

# The package's source files read as text.
pytestmark = pytest.mark.backend_independent

PACKAGE = os.path.dirname(keras_vit.__file__)


def module_names():
    """`{module name: file}` for every module of keras_vit."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                relative = os.path.relpath(os.path.join(folder, file), os.path.dirname(PACKAGE))
                name = relative[: -len(".py")].replace(os.sep, ".")
                found[name.removesuffix(".__init__")] = os.path.join(folder, file)
    return found


def imports_of(path, name, modules):
    """The keras_vit modules that the file imports anywhere, function-local imports included."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from keras_vit import data` imports the submodule; `from keras_vit.x import f` imports x.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph():
    modules = module_names()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return trail[trail.index(target):] + [target]
            if target not in state:
                cycle = visit(target, trail + [target])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def test_no_module_imports_one_that_imports_it_back():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_the_cycle_finder_sees_function_local_imports(tmp_path):
    path = tmp_path / "b.py"
    path.write_text("def f():\n    from keras_vit.a import g\n")
    graph = {"keras_vit.a": {"keras_vit.b"}, "keras_vit.b": imports_of(str(path), "keras_vit.b", {"keras_vit.a", "keras_vit.b"})}
    assert find_cycle(graph) == ["keras_vit.a", "keras_vit.b", "keras_vit.a"]


# The package's layers, lowest first: a module imports only from its own rank or a lower one.
RANKS = (
    ("keras_vit.startup", "keras_vit.utils"),
    ("keras_vit.layers", "keras_vit.data"),
    ("keras_vit.model", "keras_vit.configs", "keras_vit.fine_tuning_recipes", "keras_vit.flags"),
    ("keras_vit.checkpoints",),
    ("keras_vit.applications",),
    ("keras_vit.training",),
    ("keras_vit.tools",),
    ("keras_vit.cli", "keras_vit.api", "keras_vit.__main__", "keras_vit"),
)


def rank_of(module):
    """The rank of `module`: the longest package prefix in `RANKS` that names it."""
    ranks = {prefix: rank for rank, prefixes in enumerate(RANKS) for prefix in prefixes}
    prefixes = [prefix for prefix in ranks if module == prefix or module.startswith(prefix + ".")]
    return ranks[max(prefixes, key=len)]


def imports_running_upwards(graph):
    return sorted((name, target) for name, targets in graph.items() for target in targets
                  if rank_of(target) > rank_of(name))


def test_imports_run_one_way_layers_model_checkpoints_applications_training_tools():
    assert imports_running_upwards(import_graph()) == []


def test_the_rank_check_sees_an_upward_import():
    assert imports_running_upwards({"keras_vit.layers.blocks": {"keras_vit.model.architecture"},
                                    "keras_vit.model.graph": {"keras_vit.layers.blocks"}}) == [
        ("keras_vit.layers.blocks", "keras_vit.model.architecture")]


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in module_names().items() if (n := len(open(path).read().splitlines())) > 500}
    assert not long


@pytest.mark.backend_independent
def test_a_keras_without_a_private_attribute_keras_vit_reads_says_the_tested_range():
    import re

    import keras

    from keras_vit.utils import keras_internals

    with pytest.raises(RuntimeError, match=rf"^keras_vit reads Keras' private object._kernel, which Keras "
                                           rf"{re.escape(keras.__version__)} does not have; keras_vit is tested with "
                                           r"Keras 3.10 to 3.15: pip install 'keras<3.16'.$"):
        keras_internals.stored_kernel(object())
    pinned = open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")).read()
    assert '"keras>=3.10,<3.16"' in pinned and keras_internals.TESTED_KERAS == "3.10 to 3.15"
    assert (3, 10) <= tuple(int(part) for part in keras.__version__.split(".")[:2]) < (3, 16)


@pytest.mark.backend_independent
def test_a_keras_without_an_optimizer_hook_the_recipes_override_refuses_to_build_them(monkeypatch):
    import keras

    from keras_vit.training import recipes

    recipes.finetuning_optimizer(0.1)
    monkeypatch.delattr(keras.src.optimizers.base_optimizer.BaseOptimizer, "_clip_gradients")
    with pytest.raises(RuntimeError, match=r"^SGD overrides Keras' private Optimizer._clip_gradients, which Keras "
                                           r"\S+ does not have; keras_vit is tested with Keras 3.10 to 3.15"):
        recipes.finetuning_optimizer(0.1)


def closure(requirements):
    """The distributions that installing `requirements` brings here, read from the installed ones' metadata."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = set(), [(Requirement(text), "") for text in requirements]
    while todo:
        requirement, extra = todo.pop()
        name = canonicalize_name(requirement.name)
        if (requirement.marker and not requirement.marker.evaluate({"extra": extra})) or name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or ()
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed, so what it brings cannot be read")
        todo.extend((Requirement(text), extra) for text in requires for extra in ("", *requirement.extras))
    return found


@pytest.mark.parametrize("extra,backends", [("export", set()), ("export-jax", {"jax", "jaxlib"})])
def test_an_export_extra_installs_no_backend_but_its_own(extra, backends):
    # [export] held jax2onnx, which brings jax and flax: a [torch,export] install then ran on jax.
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    brought = closure(extras[extra])
    assert brought & {"jax", "jaxlib", "torch", "tensorflow", "tensorflow-cpu"} == backends


class Installed:
    """An installed distribution as `importlib.metadata` gives it: its name, its requirements, and pip's REQUESTED
    file where the user named it."""

    def __init__(self, name, requires=(), requested=False):
        self.metadata, self.requires, self.requested = {"Name": name}, list(requires), requested

    def read_text(self, filename):
        return "" if filename == "REQUESTED" and self.requested else None


KERAS_VIT = Installed("keras-vision-transformer", ['jax[cpu]>=0.4.30; extra == "jax"', 'torch>=2.3; extra == "torch"',
                                                   'jax2onnx>=0.8; extra == "export-jax"'])


@pytest.mark.parametrize("distributions,chosen", [
    # The venv: torch CPU first by name, then [torch,export], whose jax2onnx brought jax and flax.
    ([KERAS_VIT, Installed("torch", requested=True), Installed("jax2onnx", ["jax>=0.8.1", "flax>=0.12.1"]),
      Installed("flax", ["jax>=0.10.0"]), Installed("jax"), Installed("tensorboard", ['torch; extra == "x"'])],
     "torch"),
    # ... the same with torch from the extra: no package but keras_vit's extra needs it.
    ([KERAS_VIT, Installed("torch"), Installed("jax2onnx", ["jax>=0.8.1"]), Installed("jax")], "torch"),
    ([KERAS_VIT, Installed("jax"), Installed("timm", ["torch"]), Installed("torch")], "jax"),
    ([KERAS_VIT, Installed("jax"), Installed("torch")], "jax"),  # both chosen: the first
    ([KERAS_VIT, Installed("flax", ["jax"]), Installed("jax"), Installed("timm", ["torch"]), Installed("Torch")],
     "jax"),  # neither: the first
    ([KERAS_VIT, Installed("flax", ["jax"]), Installed("jax", requested=True), Installed("torch", requested=True)],
     "jax"),
])
def test_with_no_backend_set_and_no_tensorflow_the_backend_installed_by_name_is_taken(monkeypatch, tmp_path,
                                                                                     distributions, chosen):
    import importlib.metadata
    import sys

    from keras_vit import startup

    monkeypatch.delitem(sys.modules, "keras")  # as before Keras is imported
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # no keras.json
    monkeypatch.setattr(startup, "installed", lambda backend: backend in ("jax", "torch"))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(distributions))
    said = []
    startup.choose_backend(said.append)
    assert (os.environ["KERAS_BACKEND"], said) == (chosen, [
        f"KERAS_BACKEND is not set and TensorFlow is not installed; using {chosen} (set "
        "KERAS_BACKEND=jax|torch|tensorflow to choose)."])
