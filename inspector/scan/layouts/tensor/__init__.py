"""The tensor layout."""
