"""A full reservation in virtual time: read before buying, no create meets GKE's refusal."""

from __future__ import annotations

from sandbox.sim.reserved import ReservedConfig, run


def test_reading_first_costs_no_refused_create_and_lands_every_slice_on_the_reservation_with_room() -> None:
    looked = run(ReservedConfig(look=True, slices=4))
    assert (looked.refused, looked.accepted) == (0, 4)
    assert looked.landed_at is not None
    assert looked.reads == 8  # each slice read the full reservation, then the one with room


def test_creating_blind_meets_one_refusal_per_slice() -> None:
    blind = run(ReservedConfig(look=False, slices=4))
    assert (blind.refused, blind.accepted, blind.reads) == (4, 4, 0)
    assert blind.refused_per_slice == 1.0
