"""The domain: buying, letting go of and reconciling TPU node pools over the cloud ports.

Layered (an import-linter contract keeps it so), orchestrators first:

    reconciler                      the sweep: releases, recycles, heals what events missed
    provisioner | admission         a pending pod's slices; a Workload's slices before admission
    services                        what one function instance builds once and shares
    create                          the one route from a group of slices to GKE's creates
    release                         whether a pool may go, who runs on it, the guarded delete
    tenancy | outcomes              who may have what; the decisions provision reports
"""
