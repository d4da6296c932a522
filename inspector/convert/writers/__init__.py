"""Output layouts beyond plain shards: a loadable HF model folder, a PEFT adapter, a merged model, a universal checkpoint."""
