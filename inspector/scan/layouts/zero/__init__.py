"""The zero layout."""
