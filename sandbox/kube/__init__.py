"""The real Kubernetes control plane in the sandbox, built from pinned Go modules (see build.py)."""
