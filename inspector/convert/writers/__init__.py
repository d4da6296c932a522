"""Output layouts beyond plain shards: a loadable HF model folder (the merged model and the universal checkpoint are their kinds' own folders)."""
