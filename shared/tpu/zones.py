"""Where each TPU generation is offered, to warn before a plan names a zone that has none of it.

A GKE TPU node pool's VMs are Cloud TPU capacity, so a generation is offered in the zones Cloud
TPU's "TPU regions and zones" page lists for it (cloud.google.com/tpu/docs/types-zones, read
2026-11: the United States rows in full, Europe's v6e row, TPU7x's first zone). The page changes
as capacity grows and the lists here are incomplete outside the United States, so the product
only warns with them (``tpuprov plan``); GKE itself answers a create in a zone without the
machine type with a 400 (``Invalid machine type ... in zone ...: GCE_NOT_FOUND``), which the
provision function reports like any other refusal.
"""

from __future__ import annotations

# Keyed by the cloud.google.com/gke-tpu-accelerator value; zones marked single-tenant on the page
# are included (a reservation there is bought in that zone).
LISTED_ZONES: dict[str, tuple[str, ...]] = {
    "tpu-v4-podslice": ("us-central2-b",),
    "tpu-v5-lite-podslice": (
        "us-central1-a",
        "us-south1-a",
        "us-west1-c",
        "us-west4-a",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
    ),
    "tpu-v5p-slice": ("us-central1-a", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a"),
    "tpu-v6e-slice": (
        "us-central1-b",
        "us-east1-d",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
        "us-east4-a",
        "us-east4-b",
        "us-west1-c",
        "europe-west4-a",
        "asia-northeast1-b",
    ),
    "tpu7x": ("us-central1-c",),
}


def zone_problem(accelerator: str, location: str, generation: str) -> str:
    """Why ``location`` (a zone, or a regional cluster's region) likely has no ``accelerator``
    capacity, "" when the page lists it there or the generation is not in the table."""
    listed = LISTED_ZONES.get(accelerator)
    if not listed or not location:
        return ""
    if location in listed or any(zone.startswith(f"{location}-") for zone in listed):
        return ""
    return (
        f"Cloud TPU lists {generation} ({accelerator}) only in {', '.join(listed)}, not in {location}; "
        "GKE refuses the pool's machine type there (give your cluster's zone with --location or "
        "LOCATION)"
    )
