"""The moe layout."""
