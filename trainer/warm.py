"""Imported ahead of time by a warm spare process (the harness's chaos/spare_main.py).

It pays what every learner and syncer process pays before it can do anything: importing
torch and the trainer, and torch's lazy first-use costs (the first backward pass and the
first optimizer step import more of torch, ~2 s). A spare that has imported this module
becomes a learner or syncer in tens of milliseconds instead of seconds.
"""
from __future__ import annotations

import torch  # noqa: F401 - the point is the import

from . import __main__ as cli  # noqa: F401 - argument parsing and the subcommands
from . import learner, syncer  # noqa: F401 - both roles' modules and what they import

learner.warm_up_torch(1)
