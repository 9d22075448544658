"""Letting go: whether a pool's owner still needs it and who else runs on it, and the guarded delete.

``verdicts`` (the owner's side: gone, over, suspended past the grace, or held by its Kueue Workload),
``occupancy`` (who runs there, who waits for the shape: delete, keep, adopt or offer), ``releaser``
(the one path to a delete: cordon, look again, delete or hand over), ``guard`` (the Kubernetes side
of a guarded delete), ``handover`` (provision's side of an adoption) and ``refit`` (a slice's pool
that no longer fits its pods, replaced through the same guard).
"""
