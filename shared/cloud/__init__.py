"""The seams per cloud: ports (``ports.py``), thin adapters over the Google/Kubernetes clients, retries."""
