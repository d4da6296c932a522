"""The universal layout."""
