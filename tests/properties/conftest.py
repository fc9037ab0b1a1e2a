"""The property suites' session settings: --chaos-streaming switches every cluster they start
(through support.suite_trainer_args) to streaming DiLoCo; --chaos-reference off judges them
without a fault-free reference run."""
from __future__ import annotations

import pytest

from . import support


@pytest.fixture(autouse=True, scope="session")
def _streaming(chaos_options):
    support.use_streaming(chaos_options.streaming)
    support.use_reference(chaos_options.reference)
    yield
    support.use_streaming(False)
    support.use_reference("auto")
