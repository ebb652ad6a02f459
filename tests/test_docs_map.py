"""The docs are a map of the code; these tests keep the map true as the code moves.

Every file path a doc names in backticks or links to exists, every dotted ``machina.…`` name imports, every
``python -m …`` command is a module, and no doc points outside the repository (the project stands on its own).
"""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
TOP = ("machina", "conf", "experiments", "tests", "benchmarks", "docs")
# A repo path in backticks: a top folder of the repository and a file name with its extension, or a root script.
FOLDERS = "|".join(TOP)
PATH = re.compile(rf"`((?:{FOLDERS})/[\w./-]+\.(?:py|yaml|md|sh|png)|train\.py|eval\.py)(?:[:`\s])")
DOTTED = re.compile(r"`(machina(?:\.\w+)+)(?![\w/])")  # not a format name such as machina.checkpoint/2
MODULE_COMMAND = re.compile(r"python3? -m (machina[\w.]*)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def doc_ids():
    return [str(doc.relative_to(ROOT)) for doc in DOCS]


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids())
def test_every_path_a_doc_names_exists(doc):
    text = doc.read_text()
    missing = sorted({path for path in PATH.findall(text) if not (ROOT / path).exists()})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids())
def test_every_link_of_a_doc_leads_into_the_repository(doc):
    text = doc.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to {target}, which does not exist"
    assert "../shared" not in text and "/work/" not in text, f"{doc.name} points outside the repository"


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids())
def test_every_dotted_name_a_doc_gives_imports(doc):
    names = sorted(set(DOTTED.findall(doc.read_text())))
    broken = [name for name in names if not resolves(name)]
    assert not broken, f"{doc.name} names what does not exist: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_ids())
def test_every_module_command_is_a_module(doc):
    for module in sorted(set(MODULE_COMMAND.findall(doc.read_text()))):
        assert importlib.util.find_spec(module) is not None, f"{doc.name}: python -m {module} names no module"


def test_the_checks_find_what_is_wrong(tmp_path):
    """The patterns match what they are meant to: a moved file, a renamed class, a link out of the repository."""
    assert PATH.findall("copy `machina/losses/ppo.py` or `conf/env/nope.yaml`.") == [
        "machina/losses/ppo.py",
        "conf/env/nope.yaml",
    ]
    assert not (ROOT / "conf/env/nope.yaml").exists()
    assert resolves("machina.training.trainer.Trainer") and not resolves("machina.training.trainer.Nope")
    assert not resolves("machina.nowhere")
    assert LINK.findall("see [the guide](../../shared/x.md#part)") == ["../../shared/x.md"]
