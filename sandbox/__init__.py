"""Local stand-ins for the cloud services the provisioner talks to (GKE API, Kubernetes API, ...).

Everything here binds to 127.0.0.1 only and is meant for tests and the local sandbox.
"""
