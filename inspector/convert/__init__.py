"""Convert: plan as data, positioned reads, the streaming engine, verify, preflight."""
