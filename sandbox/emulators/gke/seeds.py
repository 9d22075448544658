"""The clusters the GKE emulator knows from the start (clusters are never created through it)."""

from __future__ import annotations

import dataclasses

from sandbox.emulators.gke.rules import region_of


@dataclasses.dataclass(frozen=True)
class ClusterSeed:
    """A cluster the emulator knows from the start (clusters are never created through it)."""

    project: str
    location: str
    name: str
    endpoint: str = "127.0.0.1"
    ca_certificate_b64: str = ""
    locations: tuple[str, ...] = ()
    # New GKE clusters are enrolled in REGULAR by default; "" seeds a cluster outside release channels.
    release_channel: str = "REGULAR"

    @property
    def path(self) -> str:
        """The resource path ``projects/P/locations/L/clusters/C``."""
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"

    @classmethod
    def from_path(
        cls,
        path: str,
        endpoint: str = "127.0.0.1",
        ca_certificate_b64: str = "",
        locations: tuple[str, ...] = (),
        release_channel: str = "REGULAR",
    ) -> ClusterSeed:
        """Build a seed from ``projects/P/locations/L/clusters/C``; zones default to the location's zone."""
        parts = path.strip("/").split("/")
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" or parts[4] != "clusters":
            raise ValueError(f"not a cluster path: {path!r}")
        location = parts[3]
        if not locations:
            locations = (location,) if region_of(location) != location else (f"{location}-a",)
        return cls(
            parts[1], location, parts[5], endpoint, ca_certificate_b64, tuple(locations), release_channel
        )
