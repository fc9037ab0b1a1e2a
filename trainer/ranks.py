"""The ranks of one learner unit: data parallel over gloo inside the unit, rank 0 outside.

A learner unit is an island of R ranks that trains as one replica: DDP over gloo on the
loopback interface averages their gradients every step. Only rank 0 talks to the syncer.
At every step boundary rank 0 tells the others whether to stop and which fragments it has
just adopted, then broadcasts those fragments' new values, so the R copies of the model
stay identical without ever exchanging anything but tensors (no pickles).

`SoloGroup` is the same interface for a unit of one rank, where every call is free.
"""
from __future__ import annotations

import hashlib
import json
import os
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from .device import collective_backend
from torch.nn.parallel import DistributedDataParallel

# Gloo must stay on the loopback interface: a unit never reaches beyond its machine.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def param_digest(params: dict[str, torch.Tensor]) -> str:
    """A short hash of the exact parameter bytes: the ranks of a unit must agree on it."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Group(Protocol):
    rank: int
    size: int

    @property
    def leader(self) -> bool: ...

    def share_setup(self, setup: dict | None) -> dict: ...

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def step_control(self, stop: bool, adopted: list[int], fragments: int) -> tuple[bool, list[int]]: ...

    def broadcast(self, tensors: list[torch.Tensor]) -> None: ...

    def mean_loss(self, loss: float) -> float: ...

    def close(self) -> None: ...


class SoloGroup:
    """A unit of one rank: it leads, and there is nobody to tell."""

    rank = 0
    size = 1

    @property
    def leader(self) -> bool:
        return True

    def share_setup(self, setup: dict | None) -> dict:
        assert setup is not None
        return setup

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def step_control(self, stop: bool, adopted: list[int], fragments: int) -> tuple[bool, list[int]]:
        return stop, adopted

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        return None

    def mean_loss(self, loss: float) -> float:
        return loss

    def close(self) -> None:
        return None


class RankGroup:
    """R ranks of one unit, joined through a file store the unit supervisor chose."""

    def __init__(self, rank: int, size: int, store_file: str, timeout: float,
                 device: torch.device = torch.device("cpu")) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank: must be in [0, {size}), got {rank}")
        self.rank = rank
        self.size = size
        self.device = device  # NCCL reduces tensors on the GPU, gloo on the host
        if device.type == "cuda":
            torch.cuda.set_device(device)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # as gloo: never beyond this machine
        dist.init_process_group(collective_backend(device), init_method=f"file://{store_file}", rank=rank,
                                world_size=size, timeout=timedelta(seconds=timeout))
        dist.barrier()  # build the communicator now, before rank 0 says HELLO and holds a lease

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def share_setup(self, setup: dict | None) -> dict:
        """Rank 0's WELCOME (config, incarnation, fragments, data position) to every rank, as JSON bytes."""
        if self.leader:
            payload = torch.frombuffer(bytearray(json.dumps(setup).encode()), dtype=torch.uint8).to(self.device)
            length = torch.tensor([payload.numel()], dtype=torch.int64, device=self.device)
        else:
            length = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(length, 0)
        if not self.leader:
            payload = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, 0)
        return json.loads(bytes(payload.cpu().numpy()).decode())

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP: its constructor broadcasts rank 0's parameters, its backward averages gradients."""
        if self.device.type == "cuda":
            return DistributedDataParallel(model, device_ids=[self.device.index])
        return DistributedDataParallel(model)

    def step_control(self, stop: bool, adopted: list[int], fragments: int) -> tuple[bool, list[int]]:
        """Rank 0's decision for this step boundary: [stop, adopted fragment mask...]."""
        control = torch.zeros(1 + fragments, dtype=torch.int32, device=self.device)
        if self.leader:
            control[0] = int(stop)
            for f in adopted:
                control[1 + f] = 1
        dist.broadcast(control, 0)
        control = control.cpu()
        return bool(control[0]), [f for f in range(fragments) if control[1 + f]]

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values of `tensors` into every rank's, in one message."""
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        dist.broadcast(flat, 0)
        if not self.leader:
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    n = t.numel()
                    t.copy_(flat[offset:offset + n].view_as(t))
                    offset += n

    def mean_loss(self, loss: float) -> float:
        value = torch.tensor([loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(value)
        return float(value) / self.size

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
