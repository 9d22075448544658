"""The Kubernetes API on kmock: storage, selectors, patching, watches, discovery, CRDs and faults."""
