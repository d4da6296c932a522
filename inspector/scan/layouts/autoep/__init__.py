"""The autoep layout."""
