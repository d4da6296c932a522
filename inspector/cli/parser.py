"""The CLI's argparse parser class: argparse's own messages through the text-out rule, "did you mean" for a
mistyped flag, one JSON object for a usage error under `--json`, and commands whose options are added only
when that command is parsed or its help shown.

Why lazy: `convert`'s options name the output kinds (`--format`'s help and default), and the kinds' modules
load numpy and ml_dtypes (~1 CPU-s); `--version`, `--help` and `scan` need none of it.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from inspector.errors import EXIT_USAGE
from inspector.text import shown

Fill = Callable[[argparse.ArgumentParser], None]


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's rules; its sub-parsers are of this class too (argparse's default)."""

    fill: Fill | None = None  # adds this command's options; run once, on first use
    wants_json = False  # set by main() when `--json` is among the arguments

    def filled(self) -> Parser:
        fill, self.fill = self.fill, None
        if fill is not None:
            fill(self)
        return self

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.filled()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.filled()
        return super().format_help()

    def format_usage(self) -> str:
        self.filled()
        return super().format_usage()

    def _print_message(self, message: str, file: Any = None) -> None:
        super()._print_message(shown(message, newlines=True), file)

    def error(self, message: str) -> NoReturn:
        """argparse's usage error, with the nearest flag for an unknown one; under `--json` also one JSON
        object on stdout, as every other failure."""
        # argparse quotes what was typed (an unknown flag, a bad value): one line, its controls escaped, since
        # the words can come from a script's variable or a pasted file name
        message = shown(_with_nearest_flag(self, message))
        if Parser.wants_json:
            from inspector.cli.console import print_json

            print_json(
                {"error": {"title": "Usage error", "message": message, "hint": "", "exit_code": EXIT_USAGE}}
            )
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _with_nearest_flag(parser: argparse.ArgumentParser, message: str) -> str:
    """`unrecognized arguments: --jsn` → `... (did you mean --json?)`, from this parser's own flags."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return message
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    near = []
    for word in message[len(prefix) :].split():
        if word.startswith("--"):
            match = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
            near += [f"{word} → {match[0]}"] if match else []
    return message + (f" (did you mean: {', '.join(near)}?)" if near else "")


def add_command(sub: Any, name: str, help: str, fill: Fill) -> None:
    """A command whose options `fill` adds when it is used."""
    p = sub.add_parser(name, help=help)
    p.fill = fill


def fill_all(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every command's options added now (shell completion, tests, the README check read them all)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                if isinstance(p, Parser):
                    p.filled()
    return parser
