"""The generated reference pages (``python -m machina.docs_reference``) are what conf/ and the commands' parsers
give now, and they cover every group, option and key of conf/ and every flag: a change to either without rerunning
the command fails here, naming the page."""

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from machina import docs_reference
from machina.docs_reference import flags

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"


def leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


@pytest.mark.parametrize("page", ["config.md", "flags.md"])
def test_the_generated_page_is_current(page):
    if page == "flags.md":
        pytest.importorskip("mettagrid")  # the MettaGrid game command's parser (the mettagrid extra)
    assert not docs_reference.stale((page,)), f"docs/reference/{page} is stale: run python -m machina.docs_reference"


def test_every_group_option_and_key_of_conf_is_in_the_config_page():
    """Walked here on its own (through the experiment link): each option file of each group has its heading, and
    each key it sets appears as the command line spells it."""
    page = CONFIG_PAGE.read_text()
    options = 0
    for folder, _, files in os.walk(CONF, followlinks=True):
        group = Path(folder).relative_to(CONF).as_posix()
        for name in sorted(f for f in files if f.endswith(".yaml")):
            path = Path(folder) / name
            if group == ".":
                assert f"### `{name}`" in page
                continue
            options += 1
            section = page.split(f"### {group}={name.removesuffix('.yaml')}\n", 1)
            assert len(section) == 2, f"{group}={name} has no section"
            text = section[1].split("\n### ", 1)[0]
            node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
            node.pop("defaults", None)
            package = path.read_text().startswith("# @package _global_")
            for key in leaves(node):
                full = key if package or not key else f"{group.replace('/', '.')}.{key}"
                assert not key or f"| `{full}` |" in text, f"{group}={name}: {full} missing"
    assert options >= 40  # every group's options, the presets included


def test_every_flag_of_every_module_command_is_on_the_flags_page():
    pytest.importorskip("mettagrid")
    page = (ROOT / "docs" / "reference" / "flags.md").read_text()
    for title, module, argv in flags.COMMANDS:
        assert f"## `{title}`" in page
        for action in flags.parser_of(module, argv)._actions:
            for option in set(action.option_strings) - {"-h", "--help"}:
                assert option in page, f"{title} {option}"


def test_check_reports_a_stale_page_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """The command's mechanism, with pages of fixed text: --check names the stale and the missing page and writes
    nothing; a plain run writes both, after which --check passes."""
    monkeypatch.setattr(docs_reference, "REFERENCE", tmp_path)
    monkeypatch.setattr(docs_reference, "PAGES", {"config.md": lambda: "new\n", "flags.md": lambda: "flags\n"})
    (tmp_path / "config.md").write_text("old\n")
    assert docs_reference.main(["--check"]) == 1
    assert (tmp_path / "config.md").read_text() == "old\n" and not (tmp_path / "flags.md").exists()
    err = capsys.readouterr().err
    assert "config.md is stale" in err and "flags.md is stale" in err
    assert docs_reference.main([]) == 0
    assert (tmp_path / "config.md").read_text() == "new\n" and (tmp_path / "flags.md").read_text() == "flags\n"
    assert docs_reference.main(["--check"]) == 0
