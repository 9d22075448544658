"""``tpuprov``: the command line (plan, catalog, decode, publish, kueue, sandbox, bench); not in the image."""
