"""`python -m inspector` runs the CLI."""

from inspector.cli.main import entry

entry()
