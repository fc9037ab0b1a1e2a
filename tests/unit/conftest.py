"""Fixtures shared by the unit tests."""
from tests.unit.syncer_rig import rig  # noqa: F401 (the in-process syncer rig, as a fixture)
