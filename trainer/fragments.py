"""Fragments: the units of synchronisation (Streaming DiLoCo).

Parameters are split into P fragments, each synchronised every H inner steps on its own
staggered clock. P=1 is plain DiLoCo. Two layouts:

- balanced: tensors packed by size so every fragment holds about the same parameter count;
- strided (Streaming DiLoCo): layer i goes to fragment i mod P, so each fragment spans the
  whole depth of the network and the fragments synchronised at different times are
  interleaved, not contiguous blocks; tensors outside the numbered layers (embeddings, the
  final norm) are packed onto the lightest fragments.

The partition depends only on the model's parameter names and shapes, so the syncer and
every learner compute the same one; the syncer still sends it in WELCOME so that a
learner never guesses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fragment:
    index: int
    names: tuple[str, ...]
    numel: int


FRAGMENT_LAYOUTS = ("balanced", "strided")
# The layer index of a parameter name: the first dotted component that is a number
# (`blocks.3.attn.qkv.weight`, `model.layers.11.mlp.up_proj.weight`, `h.0.ln_1.bias`).
LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layer_of(name: str) -> int | None:
    match = LAYER_INDEX.search(name)
    return int(match.group(1)) if match else None


def partition(shapes: dict[str, torch.Size], num_fragments: int, layout: str = "balanced") -> list[Fragment]:
    """The fragments of a model, in one of FRAGMENT_LAYOUTS (see the module docstring)."""
    if num_fragments < 1:
        raise ValueError(f"fragments: must be >= 1, got {num_fragments}")
    if num_fragments > len(shapes):
        raise ValueError(f"fragments: {num_fragments} exceeds the {len(shapes)} parameter tensors")
    if layout not in FRAGMENT_LAYOUTS:
        raise ValueError(f"fragment-layout: must be one of {', '.join(FRAGMENT_LAYOUTS)}, got {layout!r}")
    order = list(shapes)
    sizes = {n: int(torch.Size(s).numel()) for n, s in shapes.items()}
    bins: list[list[str]] = [[] for _ in range(num_fragments)]
    loads = [0] * num_fragments
    rest = order
    if layout == "strided":
        layers = sorted({i for i in map(layer_of, order) if i is not None})
        if len(layers) < num_fragments:
            raise ValueError(f"fragment-layout: strided needs at least as many numbered layers as fragments; "
                             f"the model has {len(layers)} ({', '.join(map(str, layers)) or 'none'}) "
                             f"for {num_fragments} fragments")
        slot = {layer: k % num_fragments for k, layer in enumerate(layers)}
        rest = []
        for name in order:
            layer = layer_of(name)
            if layer is None:
                rest.append(name)
            else:
                bins[slot[layer]].append(name)
                loads[slot[layer]] += sizes[name]
    for name in sorted(rest, key=lambda n: (-sizes[n], order.index(n))):
        target = min(range(num_fragments), key=lambda i: (loads[i], i))
        bins[target].append(name)
        loads[target] += sizes[name]
    return [
        Fragment(i, tuple(n for n in order if n in set(b)), loads[i]) for i, b in enumerate(bins)
    ]


class FragmentClock:
    """When each fragment falls due: H inner steps after the learner last synchronised it.

    Fragment f first falls due at step (f+1)·H/P, which staggers the fragments. After a
    push at step t the next one is due at t+H; after adopting a new global version at
    step a it is due at a+H. Counting from the adoption keeps learners of equal speed in
    phase: all adopt right after a merge, so their next pushes arrive together and merge
    together, as one DiLoCo round, instead of drifting into partial merges.
    """

    def __init__(self, sync_every: int, num_fragments: int) -> None:
        self.sync_every = sync_every
        stride = sync_every // num_fragments
        self.next_due = [(f + 1) * stride for f in range(num_fragments)]

    def due(self, step: int) -> list[int]:
        return [f for f, due in enumerate(self.next_due) if step >= due]

    def synced(self, fragment: int, step: int) -> None:
        """A push or an adoption of `fragment` happened at `step`."""
        self.next_due[fragment] = step + self.sync_every


def validate_schedule(sync_every: int, num_fragments: int, overlap: int) -> None:
    if num_fragments < 1:
        raise ValueError(f"fragments (P): must be >= 1, got {num_fragments}")
    if sync_every < 1:
        raise ValueError(f"sync_every (H): must be >= 1, got {sync_every}")
    if sync_every % num_fragments:
        raise ValueError(f"fragments (P): {num_fragments} must divide sync_every (H) = {sync_every}")
    if overlap < 0 or overlap >= max(1, sync_every // num_fragments):
        raise ValueError(
            f"overlap (tau): must be in [0, H/P) = [0, {sync_every // num_fragments}), got {overlap}"
        )


def fragment_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], names: list[str]) -> float:
    """The L2 distance between two sets of a fragment's tensors (one norm kernel per tensor:
    the learners score every adoption with it)."""
    return sum(float(torch.linalg.vector_norm(a[n].detach() - b[n].detach())) ** 2 for n in names) ** 0.5


def fragment_norm(tensors: dict[str, torch.Tensor], names: list[str]) -> float:
    """The L2 norm of a fragment's tensors."""
    return sum(float(torch.linalg.vector_norm(tensors[n].detach())) ** 2 for n in names) ** 0.5
