"""What both faces draw alike, as Rich renderables: the CLI prints them, the app puts them in a widget.

Only `cli/` and `tui/` import this package (`tests/test_boundaries.py`); it sits on the core and Rich and
never on either face, so the two keep not knowing each other while drawing one thing one way."""
