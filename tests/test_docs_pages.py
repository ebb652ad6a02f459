"""What the README, the changelog and the guarantees page state is checked against what it describes: the README is
a first screen (at most 10,000 characters) whose config table lists every group and option of conf/, whose set-up
and test commands are the ones CI runs, and whose links lead to files of the repository; every test the guarantees
page names exists; the changelog lists every renamed setting."""

import os
import re
import shlex
from pathlib import Path

import pytest

from machina.startup.renamed import RENAMED

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)\s]+)\)")


def readme_section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_first_screen():
    assert len(README) <= 10_000, f"README.md is {len(README)} characters"


def test_the_readme_config_table_lists_every_group_and_option_of_conf():
    rows = {}
    for line in readme_section("Configuration").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([\w/]+)`", cells[1]))
    conf = ROOT / "conf"
    for folder, _, files in os.walk(conf, followlinks=True):
        options = {name.removesuffix(".yaml") for name in files if name.endswith(".yaml")}
        group = Path(folder).relative_to(conf).as_posix()
        if group == "." or not options:
            continue
        assert group in rows, f"the README's config table has no row for the group {group}"
        assert options <= rows[group], f"{group}: the README's table misses {sorted(options - rows[group])}"
    assert "linear_tail" in rows["learner/lr_schedule"]  # the main job's learning-rate schedule


def commands(text: str) -> list[str]:
    """Shell commands of ``text``, one per step of ``a && b`` chains, with pip's -q left out."""
    steps = [step.strip() for line in text.splitlines() for step in line.split("&&")]
    words = [shlex.split(step) for step in steps if step and step[0] != "#"]
    return [shlex.join(w for w in step if not (step[0] == "pip" and w == "-q")) for step in words]


def test_the_readme_set_up_and_test_commands_are_those_ci_runs():
    """Every set-up step of .ci/run (less `pip install --upgrade pip`) and its test command are in the README's
    two commands, in the same order."""
    ci = [c for c in commands((ROOT / ".ci" / "run").read_text()) if c.split()[0] in {"python3", ".", "pip", "python"}]
    ci = [c for c in ci if "--upgrade pip" not in c]
    blocks = re.findall(r"```bash\n(.*?)```", readme_section("Set up, and run the main job"), re.S)
    setup, tests = commands(blocks[0]), commands(blocks[1])
    assert [c for c in setup if c in ci] == [c for c in ci if c in setup] and set(ci) <= set(setup) | set(tests), ci
    assert tests[-1] == ci[-1] == "python -m pytest -q"
    assert setup[-2:] == ["python train.py experiment=debug", "python train.py"]


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md"])
def test_every_link_of_a_root_page_leads_to_a_file_of_the_repository(page):
    text = (ROOT / page).read_text()
    for target in LINK.findall(text):
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"{page} links to {target}"


def test_every_test_the_guarantees_page_names_exists():
    page = (ROOT / "docs" / "reference" / "guarantees.md").read_text()
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", page)
    assert len(named) >= 20
    for file, test in named:
        source = ROOT / file
        assert source.exists() and re.search(rf"^def {test}\(", source.read_text(), re.M), f"{file}::{test}"


def test_the_changelog_lists_every_renamed_setting():
    text = (ROOT / "CHANGELOG.md").read_text()
    for old, new in RENAMED.items():
        assert f"`{old}" in text and f"`{new}" in text, f"CHANGELOG.md misses {old} -> {new}"
