"""The pipeline layout."""
