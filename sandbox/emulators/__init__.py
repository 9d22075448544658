"""Emulators of the services the product calls or is fed by: GKE, Kubernetes, Pub/Sub, Eventarc, Logging."""
