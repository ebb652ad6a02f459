"""The generated pages of docs/reference/, written from what they describe so that they cannot drift from it:

    python -m machina.docs_reference            # writes docs/reference/config.md and docs/reference/flags.md
    python -m machina.docs_reference --check    # exit 1, naming each stale page, when one differs

``config.md`` comes from ``conf/`` and the docstrings of the classes it names (``machina.docs_reference.config``),
``flags.md`` from the commands' argument parsers (``machina.docs_reference.flags``). ``tests/test_docs_reference.py``
fails when either page is not what this command writes.
"""

import argparse
import sys
from pathlib import Path

from machina.docs_reference import config, flags

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
PAGES = {"config.md": config.render, "flags.md": flags.render}


def stale(names: tuple[str, ...] = tuple(PAGES)) -> dict[Path, str]:
    """Each generated page of ``names`` whose file differs from what the command writes now, with its current text."""
    pages = {REFERENCE / name: PAGES[name]() for name in names}
    return {path: text for path, text in pages.items() if not path.exists() or path.read_text() != text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m machina.docs_reference", description="Write the generated pages of docs/reference/."
    )
    parser.add_argument("--check", action="store_true", help="exit 1, writing nothing, when a page is stale")
    args = parser.parse_args(argv)
    changed = stale(tuple(PAGES))
    for path, text in changed.items():
        if args.check:
            print(f"{path} is stale: run python -m machina.docs_reference", file=sys.stderr)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return 1 if args.check and changed else 0
