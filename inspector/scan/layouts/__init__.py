"""Checkpoint layouts, one package each, behind `LAYOUTS` (the protocol: `base.py`)."""
