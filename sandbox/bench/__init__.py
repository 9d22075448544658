"""``tpuprov bench``: cold start, per-event overhead, event storms and memory, with a naive reference."""
