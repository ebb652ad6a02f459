"""The layers of machina point one way: a module imports machina modules of its own layer or below, never above.

    0  contracts and files: machina.keys, machina.errors, machina.progress, machina.checks (one setting's checks),
       machina.schedules, machina.precision (of matrix products), and machina.files (reading and writing files
       safely, which knows no part of training)
    1  machina.env
    2  machina.policy (built from the env's spec)
    3  machina.losses (read the policy's outputs)
    4  machina.training, machina.evaluation, machina.logging: the loop and what it measures and reports
    5  the application: machina.startup (the config into parts), machina.run_folder, machina.run, machina.cli,
       machina.start_up_signals (a command's signals outside training),
       machina.compare, machina.plot, machina.bench, machina.speed (benchmarks), machina.conformance (the kit that
       checks a part against what the trainer relies on), machina.docs_reference (the generated reference pages)

machina.run_folder is in the application layer: it lists the checkpoints training writes (``history`` reads them
through ``machina.training.checkpoint``), and nothing below the application needs a run folder's history, lock or
record. Two modules of one layer may import each other's parts (training and evaluation do). Every import counts:
those inside functions (a lazy import is still a dependency) and relative ones. Read with ``ast``, nothing imported.
"""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

LAYERS = (
    (
        "machina.keys",
        "machina.errors",
        "machina.progress",
        "machina.checks",
        "machina.schedules",
        "machina.precision",
        "machina.files",
    ),
    ("machina.env",),
    ("machina.policy",),
    ("machina.losses",),
    ("machina.training", "machina.evaluation", "machina.logging"),
    (
        "machina.startup",
        "machina.run_folder",
        "machina.run",
        "machina.cli",
        "machina.start_up_signals",
        "machina.compare",
        "machina.plot",
        "machina.bench",
        "machina.speed",
        "machina.conformance",
        "machina.docs_reference",
    ),
)


def layer(module: str) -> int | None:
    """The layer of a dotted module name (a package's modules share its layer); None when it has none. ``machina``
    itself holds only its docstring: importing it costs nothing, so it is below every layer."""
    if module == "machina":
        return -1
    for number, names in enumerate(LAYERS):
        if any(module == name or module.startswith(f"{name}.") for name in names):
            return number
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` of every machina module ``source`` imports, at any depth, relative imports resolved
    against ``module`` (``from machina.files import atomic`` imports ``machina.files.atomic``)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [
                (node.lineno, f"{base}.{alias.name}" if layer(base) is not None else base) for alias in node.names
            ]
    return [(line, name) for line, name in found if name == "machina" or name.startswith("machina.")]


def upward(source: str, module: str, is_package: bool = False) -> list[str]:
    """``module:line imports name (layer A -> B)`` for each import of ``source`` from a layer above ``module``'s,
    or of a machina module that has no layer."""
    own = layer(module)
    wrong = []
    for line, name in imported(source, module, is_package):
        if layer(name) is None or layer(name) > own:
            wrong.append(f"{module}:{line} imports {name} (layer {own} -> {layer(name)})")
    return wrong


def modules() -> list[tuple[str, Path]]:
    return [(module_name(path), path) for path in sorted((ROOT / "machina").rglob("*.py"))]


def test_every_module_has_a_layer():
    """A new package or top-level module must be given its place in ``LAYERS`` (and the docstring) first."""
    assert [name for name, _ in modules() if layer(name) is None] == []


def test_imports_point_down():
    wrong = [
        message for name, path in modules() for message in upward(path.read_text(), name, path.name == "__init__.py")
    ]
    assert wrong == [], "imports from a higher layer:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "module, source",
    [
        ("machina.env.machina_1.grid", "from machina.training.trainer import Trainer\n"),
        ("machina.env.machina_1.grid", "import machina.losses.ppo\n"),
        ("machina.files.atomic", "from machina import policy\n"),
        ("machina.losses.ppo", "def lazy():\n    from machina.training import learner\n"),
        ("machina.training.learner", "from ..run_folder import history\n"),
        ("machina.training.learner", "from ..startup.system import System\n"),
        ("machina.policy.io", "from machina.nowhere import thing\n"),
    ],
)
def test_an_upward_import_is_found(module, source):
    """The check itself: an import from a higher layer, written any way Python allows, is reported."""
    assert len(upward(source, module)) == 1


@pytest.mark.parametrize(
    "module, source",
    [
        ("machina.env.machina_1.grid", "from machina import keys\nfrom machina.errors import ConfigError\n"),
        ("machina.training.learner", "from machina.losses.base import Loss\nfrom . import advantage\n"),
        ("machina.training.trainer", "from machina.evaluation.evaluator import Evaluator\n"),
        ("machina.run", "import machina.training.trainer\nimport torch\n"),
    ],
)
def test_imports_of_the_same_layer_or_below_pass(module, source):
    assert upward(source, module) == []
