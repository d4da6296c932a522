"""Screens and panes: overview, tensors, export options, convert, help, dialogs."""
