"""TPU knowledge with no I/O: the catalog, pod -> slice -> NodePool derivation, node-pool types, JobSets."""
