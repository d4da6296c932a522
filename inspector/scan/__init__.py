"""Scan: locate a checkpoint, the layouts registry (`layouts/`, one package per checkpoint layout) and the core
they share (rank-file classification, ZeRO layout arithmetic, tensor joins, placement), the Checkpoint model,
the scanner, summaries."""
