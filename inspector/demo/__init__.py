"""A realistic demo checkpoint in DeepSpeed's exact on-disk layout."""
