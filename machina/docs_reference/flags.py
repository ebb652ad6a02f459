"""docs/reference/flags.md from the commands' own argument parsers, so a flag's page cannot drift from the flag.

Each ``python -m`` command's ``main(argv)`` is called until it asks its parser to read the arguments; the parser is
taken there (nothing runs) and its description, positional arguments and flags become a section: each flag with its
default and its help line. ``train.py`` and ``eval.py`` are Hydra applications: their settings are the configuration
(docs/reference/config.md) and their flags Hydra's (docs/reference/commands.md).
"""

import argparse
import importlib
from unittest import mock

from machina.docs_reference.config import GENERATED, cell

# The command as typed, the module whose main(argv) runs it, and the arguments that pick a mode.
COMMANDS = (
    ("python -m machina.compare", "machina.compare", []),
    ("python -m machina.plot", "machina.plot", []),
    ("python -m machina.bench", "machina.bench", []),
    ("python -m machina.bench env", "machina.bench", ["env"]),
    ("python -m machina.bench mettagrid", "machina.bench", ["mettagrid"]),
    ("python -m machina.bench policy", "machina.bench", ["policy"]),
    ("python -m machina.bench overhead", "machina.bench", ["overhead"]),
    ("python -m machina.bench profile", "machina.bench", ["profile"]),
    ("python -m machina.speed.contention", "machina.speed.contention", []),
    ("python -m machina.env.mettagrid.game", "machina.env.mettagrid.game", []),
    ("python -m machina.docs_reference", "machina.docs_reference", []),
)


class Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def parser_of(module: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser that ``module.main(argv)`` reads its arguments with, taken before it reads them."""

    def capture(parser, *args, **kwargs):
        raise Captured(parser)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", autospec=True, side_effect=capture):
        try:
            importlib.import_module(module).main(argv)
        except Captured as captured:
            return captured.parser
    raise RuntimeError(f"{module}.main({argv}) read no arguments with argparse")


def default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    value = " ".join(map(str, action.default)) if isinstance(action.default, list) else str(action.default)
    return f"`{value}`" if value else ""


def section(title: str, parser: argparse.ArgumentParser, level: str = "##") -> list[str]:
    """One command: its description's first paragraph, then a row per argument (positional ones first)."""
    lines = [f"{level} `{title}`", ""]
    if parser.description:
        lines += [cell(" ".join(parser.description.strip().split("\n\n")[0].split())), ""]
    rows, subcommands = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            subcommands += list(action.choices.items())
            continue
        name = ", ".join(action.option_strings) or action.dest
        choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else ""
        metavar = action.metavar or choices or (action.dest.upper() if action.nargs != 0 else "")
        help_text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
        rows.append(
            f"| `{name}{' ' + str(metavar) if metavar and action.option_strings else ''}` | "
            f"{default(action)} | {cell(help_text)} |"
        )
    if rows:
        lines += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    for name, sub in subcommands:
        lines += section(f"{title} {name}", sub, level + "#")
    return lines


def render() -> str:
    lines = [
        GENERATED.format(source="the commands' argument parsers"),
        "# Flags of the module commands",
        "",
        "The arguments of every module command of machina (`python -m`), read from its own parser. `train.py` and "
        "`eval.py` take config settings instead ([config reference](config.md)) and Hydra's flags "
        "([commands](commands.md)).",
        "",
    ]
    for title, module, argv in COMMANDS:
        lines += section(title, parser_of(module, argv))
    return "\n".join(lines).rstrip() + "\n"
