"""A signed PUSH from a learner holding the secret, straight into the syncer's core
(SyncerCore.parse_push and admit_push): every field and tensor drawn from the input,
plausible or absurd. The only acceptable outcomes are a decided ticket or a
ProtocolError; and the global parameters stay finite. The core is sans-IO, so an accepted
push is entered in memory with no file written: this target is about validation."""
from __future__ import annotations

import tempfile

import atheris
import torch

from trainer import wire
from trainer.codec import ENCODINGS, encode
from trainer.config import SyncerConfig, TrainConfig
from trainer.model import ModelConfig
from trainer.protocol import ProtocolError, Status
from trainer.syncer import SyncerCore

NAME = "push_validation"
_state: dict = {}


def setup() -> None:
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="islands-fuzz-push-")
    train = TrainConfig(model=ModelConfig(n_layer=1, n_embd=8, n_head=2, block_size=8), num_learners=2,
                        sync_every=4, fragments=2, batch_size=2)
    s = SyncerCore(SyncerConfig(state_dir=f"{root}/state"), train)
    s.members.join(1, "fuzz", conn=1, now=0.0)
    _state["syncer"] = s


def _number(fdp: atheris.FuzzedDataProvider) -> object:
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind == 0:
        return fdp.ConsumeIntInRange(0, 64)
    if kind == 1:
        return fdp.ConsumeInt(8)
    if kind == 2:
        return 10 ** fdp.ConsumeIntInRange(0, 400)
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind == 4:
        return fdp.ConsumeUnicodeNoSurrogates(8)
    return None


def _tensors(fdp: atheris.FuzzedDataProvider, s: SyncerCore, fragment: int) -> dict[str, torch.Tensor]:
    names = s.specs[fragment % len(s.specs)].names
    scale = fdp.PickValueInList([0.0, 1e-3, 1.0, 1e6, 3.4e38, float("inf"), float("nan")])
    out = {n: torch.randn(s.shapes[n], generator=torch.Generator().manual_seed(fdp.ConsumeIntInRange(0, 9))) * scale
           for n in names}
    if fdp.ConsumeBool() and out:
        out.pop(next(iter(out)))
    if fdp.ConsumeBool():
        out["stray"] = torch.zeros(fdp.ConsumeIntInRange(0, 4))
    return out


def test_one_input(data: bytes) -> None:
    s: SyncerCore = _state["syncer"]
    fdp = atheris.FuzzedDataProvider(data)
    header: dict = {"learner": 1}
    for key in ("fragment", "incarnation", "seq", "base_version", "tokens", "steps", "position", "step_tokens"):
        if fdp.ConsumeIntInRange(0, 9):
            header[key] = _number(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else fdp.ConsumeIntInRange(0, 200)
    encoding = fdp.PickValueInList([*ENCODINGS, "", "int3"])
    header["encoding"] = encoding
    fragment = header.get("fragment") if isinstance(header.get("fragment"), int) else 0
    try:
        payload = wire.pack_tensors(encode(_tensors(fdp, s, int(fragment)), encoding if encoding in ENCODINGS else "fp32"))
    except ValueError:
        payload = fdp.ConsumeBytes(64)
    if fdp.ConsumeIntInRange(0, 7) == 0:
        payload = fdp.ConsumeBytes(256)
    frame = wire.Frame(wire.PUSH, header, payload)
    try:
        ticket = s.admit_push(s.parse_push(frame, learner=1))
        if ticket.status == Status.ACCEPTED:
            s.push_durable(ticket)
        s.push_answer(ticket)
    except ProtocolError:
        pass
    for frag in s.frags:
        frag.pending.clear()
        frag.merging.clear()
    if not all(bool(torch.isfinite(t).all()) for f in s.frags for t in f.params.values()):
        raise AssertionError("the global parameters are not finite")
