"""Where a learner computes, and in which precision: `--device` and `--precision`.

The inner steps run on the device (autocast to bf16 with `--precision bf16`); pseudo-
gradients are computed there and moved to the host only to be encoded. The syncer always
stays on CPU: it holds Θ and merges, it never trains.
"""
from __future__ import annotations

import contextlib

import torch

from .argtypes import check_device

PRECISIONS = ("fp32", "bf16")


def resolve_device(spec: str, rank: int = 0) -> torch.device:
    """auto: CUDA when present, else CPU. Asking for CUDA on a machine without it is an error.
    Rank r of a unit takes the r-th GPU from the one named (NCCL needs one GPU per rank)."""
    check_device(spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {spec}: this machine has no CUDA device (torch {torch.__version__})")
        index = (int(spec.split(":", 1)[1]) if ":" in spec else 0) + rank
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {spec}: rank {rank} needs CUDA device {index}, and there are only "
                             f"{torch.cuda.device_count()}")
        return torch.device("cuda", index)
    return torch.device("cpu")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The inner step's numeric context: bf16 autocast, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def collective_backend(device: torch.device) -> str:
    """The ranks of one unit reduce over NCCL on CUDA, over gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"
