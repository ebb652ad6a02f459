"""The docs site builds strictly: ``mkdocs build --strict`` with mkdocs.yml's validation turns every broken link,
missing anchor, page left out of the nav or link out of docs/ into a warning, and strict makes any warning fail.
Built in process into a temporary folder, as CI's test command runs it."""

import logging
from pathlib import Path

from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

ROOT = Path(__file__).resolve().parents[1]


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def build_site(docs_dir: Path, site_dir: Path) -> list[str]:
    """Build with the repository's mkdocs.yml (its docs_dir replaced); the warnings mkdocs logged."""
    warnings = Warnings()
    logger = logging.getLogger("mkdocs")
    level = logger.level
    logger.setLevel(logging.WARNING)  # a quiet logger (mkdocs -q) would hide warnings from strict mode's count
    logger.addHandler(warnings)
    try:
        build(load_config(str(ROOT / "mkdocs.yml"), docs_dir=str(docs_dir), site_dir=str(site_dir), strict=True))
    except Abort:
        pass  # strict mode's own stop: the warnings say why
    finally:
        logger.removeHandler(warnings)
        logger.setLevel(level)
    return warnings.messages


def test_the_site_builds_strictly_with_no_warning(tmp_path):
    assert build_site(ROOT / "docs", tmp_path) == []
    assert (tmp_path / "reference" / "config" / "index.html").exists()
    assert (tmp_path / "tutorials" / "first_run" / "index.html").exists()


BROKEN = {
    "[a page that is not there](nope.md)": "nope.md",
    "[an anchor that is not there](first_run.md#nope)": "#nope",
    "[a file outside the docs](../../README.md)": "README.md",
}


def test_broken_links_and_anchors_fail_the_build(tmp_path):
    """The same build on a copy of docs/ with bad links in a tutorial: the strict build reports each one."""
    docs = tmp_path / "docs"
    for path in (ROOT / "docs").rglob("*"):
        target = docs / path.relative_to(ROOT / "docs")
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.symlink_to(path)
    page = docs / "tutorials" / "sweeps.md"
    page.unlink()
    page.write_text((ROOT / "docs" / "tutorials" / "sweeps.md").read_text() + "\n" + "\n".join(BROKEN) + "\n")
    warnings = build_site(docs, tmp_path / "site")
    for expected in BROKEN.values():
        assert any(expected in message for message in warnings), (expected, warnings)
    assert len(warnings) == len(BROKEN), warnings
