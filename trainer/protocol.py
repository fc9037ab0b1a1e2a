"""The names both ends of the wire agree on: frame types, reply statuses, refusal reasons.

They were bare strings matched by hand on each side; one list here means a reason the
syncer gives is one the learner, the checkers and the README can name, and a typo is an
AttributeError instead of a silent mismatch. Every value is a `str` (StrEnum), so it
goes into JSON headers and events unchanged.
"""
from __future__ import annotations

from enum import StrEnum


class FrameType(StrEnum):
    """Requests go learner → syncer; each gets exactly one reply."""

    HELLO = "HELLO"
    WELCOME = "WELCOME"
    PUSH = "PUSH"
    ACK = "ACK"
    HEARTBEAT = "HEARTBEAT"
    BEAT = "BEAT"
    PULL = "PULL"
    FRAGMENT = "FRAGMENT"
    GRAD = "GRAD"
    MEAN = "MEAN"
    BYE = "BYE"
    ERROR = "ERROR"


# A HEARTBEAT that names the versions a learner knows may wait this long (ms) for a merge
# to pass them: a long poll. The syncer holds none longer, whatever `wait_ms` asks.
MAX_POLL_MS = 1000

REQUEST_TYPES = frozenset({FrameType.HELLO, FrameType.PUSH, FrameType.HEARTBEAT, FrameType.PULL,
                           FrameType.GRAD, FrameType.BYE})
REPLY_TYPES = frozenset({FrameType.WELCOME, FrameType.ACK, FrameType.BEAT, FrameType.FRAGMENT,
                         FrameType.MEAN, FrameType.ERROR})


class Status(StrEnum):
    """What an ACK says about a push (or a BYE)."""

    ACCEPTED = "accepted"    # durable in the syncer's state: it will be merged exactly once
    DUPLICATE = "duplicate"  # this id is already accepted (a retry): nothing new happened
    STALE = "stale"          # based on a version more than --max-staleness behind: dropped, counted
    BYE = "bye"              # the learner's clean leave is recorded


class Reason(StrEnum):
    """Why a frame, a request, a connection or a pending push was refused."""

    # The frame itself (wire.py): the connection is closed, since the byte stream can no
    # longer be trusted to be in step.
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    OVERSIZED = "oversized"
    TRUNCATED = "truncated"
    BAD_MAC = "bad_mac"              # wrong secret, tampered, or replayed (another connection or position)
    BAD_HEADER = "bad_header"        # not a bounded JSON object, or a field out of its type
    BAD_CRC = "bad_crc"
    BAD_PAYLOAD = "bad_payload"
    PROTOCOL = "protocol"            # a frame out of order (e.g. not HELLO first)
    # Admission (syncer/core.py, admission.py): said in events; the peer just sees a close.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    UNAUTHENTICATED_LIMIT = "unauthenticated_limit"
    CONNECTION_LIMIT = "connection_limit"
    IDLE_TIMEOUT = "idle_timeout"
    # A well-formed, authenticated request the syncer will not act on (validation.py).
    MODE_MISMATCH = "mode_mismatch"
    BAD_LEARNER = "bad_learner"
    BAD_IDENTITY = "bad_identity"    # a HELLO not under the key of the learner it names (keys.py)
    BAD_FRAGMENT = "bad_fragment"
    BAD_INCARNATION = "bad_incarnation"
    OUT_OF_BOUNDS = "out_of_bounds"  # a count beyond what the learner can have done
    BAD_TENSOR = "bad_tensor"        # wrong names, shapes, dtype, or non-finite values
    IMPLAUSIBLE_NORM = "implausible_norm"
    INTERNAL = "internal"            # the syncer failed handling it; answered, counted, logged
    # The syncer's disk would not take the push (storage.py): nothing of it counts, and the
    # learner keeps it and sends it again, under the same id, after a backoff.
    STORAGE_FULL = "storage_full"    # ENOSPC or EDQUOT: no space for the push's file
    STORAGE_IO = "storage_io"        # EIO or another disk error, or a failed sync earlier
    IN_FLIGHT = "in_flight"          # a retry of a push whose first attempt is still being stored
    # A pending push that cannot be merged (syncer/core.py, quarantine.py).
    MERGE_ERROR = "merge_error"
    NONFINITE_MERGE = "nonfinite_merge"
    BAD_PENDING = "bad_pending"

    @property
    def closes_connection(self) -> bool:
        """Frame-level and handshake faults end the connection; a refused request does not
        (its frame was authenticated and in step, so the next one can be read)."""
        return self in _CLOSING


_CLOSING = frozenset({Reason.BAD_MAGIC, Reason.BAD_VERSION, Reason.OVERSIZED, Reason.TRUNCATED,
                      Reason.BAD_MAC, Reason.BAD_HEADER, Reason.BAD_CRC, Reason.BAD_PAYLOAD, Reason.PROTOCOL,
                      Reason.HANDSHAKE_TIMEOUT, Reason.CONNECTION_LIMIT, Reason.MODE_MISMATCH, Reason.BAD_LEARNER,
                      Reason.BAD_IDENTITY, Reason.INTERNAL})

# A learner that hears one of these keeps its push and retries it after a backoff, under the
# same id. `internal` among them: a syncer that failed handling a push may have stored it
# first, or not, so its fate is unknown; the retry is answered duplicate if it was stored.
RETRY_LATER_REASONS = frozenset({Reason.STORAGE_FULL, Reason.STORAGE_IO, Reason.IN_FLIGHT, Reason.INTERNAL})

# A learner that hears one of these cannot do better by retrying: it stops.
FATAL_REASONS = frozenset({Reason.MODE_MISMATCH, Reason.BAD_LEARNER, Reason.BAD_IDENTITY})


class ProtocolError(Exception):
    """A frame or request that is refused, with the reason from the one list above."""

    def __init__(self, reason: Reason | str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class FrameFault(ProtocolError):
    """A frame that could not be read or trusted (wire.py): for a learner, a reason to
    reconnect, not a decision of the syncer's."""


class Refusal(ProtocolError):
    """The peer answered ERROR: a decision, not a network fault. `reason` is the peer's
    word, kept as a string when it is not one this side knows."""


def reason_of(text: object) -> Reason | str:
    """The Reason named by a peer's ERROR header, or the raw string if it is unknown."""
    try:
        return Reason(str(text))
    except ValueError:
        return str(text)
