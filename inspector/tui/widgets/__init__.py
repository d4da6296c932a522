"""Reusable widgets: summary card, ranks view, module tree, tensor detail, preflight panel, memory meter."""
