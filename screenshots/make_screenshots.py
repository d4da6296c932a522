"""Regenerate the README screenshots: real command output on a demo checkpoint, saved as SVG.

    python screenshots/make_screenshots.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO

from rich.console import Console

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without an install


def _record(name: str, argv: list[str], width: int = 110, live: bool = True) -> None:
    """Run a CLI command with a recording console and save what it printed as SVG.

    `live=False` records the plain progress lines CI logs get (a live bar's frames do not export)."""
    import inspector.cli.console as cli_console
    import inspector.cli.main as cli

    console = Console(record=True, width=width, force_terminal=live, color_system="truecolor", highlight=False)
    original = cli._console
    # main.py holds its own reference; convert/verify/preflight look the factory up when they run
    cli._console = cli_console.console = lambda stderr=False: console  # type: ignore[assignment]
    try:
        with redirect_stdout(StringIO()):
            cli.main(argv)
    finally:
        cli._console = cli_console.console = original  # type: ignore[assignment]
    path = os.path.join(HERE, f"{name}.svg")
    console.save_svg(path, title=f"zero-inspector {' '.join(a if '/' not in a else os.path.basename(a) for a in argv)}")
    print("wrote", path)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        demo = os.path.join(tmp, "demo-checkpoint")
        _record("demo", ["demo", demo, "--stage", "3", "--world-size", "4", "--params", "20M"])
        _record("scan", ["scan", demo])
        _record("preflight", ["preflight", demo, "--out", os.path.join(tmp, "out"), "--dtype", "bf16"])
        _record("convert", ["convert", demo, os.path.join(tmp, "out"), "--dtype", "bf16", "--shard-size", "20MB"], live=False)
        _record("verify", ["verify", demo, os.path.join(tmp, "out")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
