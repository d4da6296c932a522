"""`python -m inspector` runs the CLI."""

from inspector.cli import entry

entry()
