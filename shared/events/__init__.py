"""Decoding what arrives: CloudEvent/Pub/Sub envelopes, Cloud Logging entries and fields, setup triggers."""
