"""Shell completion for bash, zsh and fish, by argcomplete (the optional extra `completion`), never by hand:
the completions come from the same parser the commands are read with, so they cannot drift from it.

`zero-inspector completion SHELL` prints the shell's hook; when the shell then asks for completions it runs
the program with `_ARGCOMPLETE` set, and `complete` answers from the full parser before any command runs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from inspector.errors import EXIT_OK, InspectorError

SHELLS = ("bash", "zsh", "fish")
_PROG = "zero-inspector"


def _missing() -> InspectorError:
    return InspectorError(
        "Shell completion needs the argcomplete package, which is not installed.",
        hint="pip install 'zero-inspector[completion]' (or `pip install argcomplete` into the same "
        "environment), then run this command again.",
        title="Completion not installed",
    )


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the hook for `args.shell`, and how to install it."""
    try:
        import argcomplete
    except ImportError:
        raise _missing() from None
    print(argcomplete.shellcode([_PROG], shell=args.shell), end="")
    return EXIT_OK


_HELP = (
    "print the shell completion hook for bash, zsh or fish (needs the `completion` extra). Install it with "
    '`eval "$(zero-inspector completion bash)"` in ~/.bashrc, the same with zsh in ~/.zshrc, or '
    "`zero-inspector completion fish > ~/.config/fish/completions/zero-inspector.fish`"
)


def add_completion(sub: Any) -> None:
    from inspector.cli.parser import add_command

    def fill(p: argparse.ArgumentParser) -> None:
        p.description = _HELP
        p.add_argument("shell", choices=SHELLS, help="the shell to print the hook for")
        p.set_defaults(func=cmd_completion)

    add_command(sub, "completion", "print the shell completion hook (bash, zsh, fish)", fill)


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer a completion request (`_ARGCOMPLETE` set by the hook) and exit; nothing when there is none."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return  # the hook was installed with argcomplete since removed: no completions, no error text
    from inspector.cli.parser import fill_all

    argcomplete.autocomplete(fill_all(parser))
