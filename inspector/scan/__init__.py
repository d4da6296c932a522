"""Scan: locate a checkpoint, the ZeRO layout arithmetic, the Checkpoint model, the scanner, summaries."""
