"""The syncer: the outer optimizer of decoupled DiLoCo, as a TCP service.

It holds the global parameters Θ split into fragments, merges pushes from whichever
learners report (quorum K, grace window, token weights, staleness bound), and never waits
for any one learner. In sync mode it is instead the all-reduce point of a conventional
data-parallel baseline: every step waits for every live learner.

  core.py            every decision, sans-IO: inputs with the time in, answers out
  outer_step.py      one merge's arithmetic, on copies
  fragment_state.py  what is held per fragment and per pending push
  service.py         the I/O shell: sockets, threads, the lock, durable writes
"""
from ..merge_rule import grace_window, predict_arrival  # noqa: F401  (re-exported for tests and docs)
from .core import ADMISSION_REASONS, MERGE_RETRY_SECONDS, SyncerCore  # noqa: F401
from .service import DISK_FAILED_EXIT, REPLY_DEADLINE, PortInUse, Syncer, bind_listener, serve, write_address_file  # noqa: F401
