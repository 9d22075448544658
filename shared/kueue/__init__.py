"""Kueue queue configuration: the config model, its checks, rendering to Kueue objects, and applying them."""
