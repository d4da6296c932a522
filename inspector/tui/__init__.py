"""The Textual face of zero-inspector: explore a checkpoint, choose what to export, preflight, convert.

Only `inspector.cli` imports this package (lazily, to launch the app); the core never does.
"""
