"""The built-in task (`--task gpt`, the default): the byte-level GPT of model.py on the
Markov source or a folder of text (`--data`), through the same Task contract as any user's."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..data import Corpus, ShardSampler, evaluation_batches, load_corpus
from ..model import GPT, ModelConfig

# The jitter stream of a first incarnation (the syncer numbers them from 1), as the sampler drew
# it before tasks existed: the built-in task's fault-free runs see the same batches as then.
# A restarted learner seeks to its position (`start`) with a stream of its own.
STREAM = 1
EVAL_BATCH_SIZE = 16   # windows per held-out batch, whatever the run trains with: one fixed set per corpus


@dataclass
class GPTTask:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    data: str = "markov"
    batch_size: int = 16

    loaded: Corpus | None = None  # the corpus, when the caller has it already

    @classmethod
    def from_options(cls, options: dict) -> "GPTTask":
        """`data` is a --data spec, or a Corpus already loaded."""
        data = options.get("data") or "markov"
        loaded = data if isinstance(data, Corpus) else None
        return cls(options.get("model") or ModelConfig(), loaded.name if loaded else data,
                   int(options.get("batch_size") or 16), loaded)

    @cached_property
    def corpus(self) -> Corpus:
        return self.loaded if self.loaded is not None else load_corpus(self.data)

    def model(self) -> torch.nn.Module:
        return GPT(self.model_config)

    def batches(self, shard: int, shards: int, seed: int,
                start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """From batch `start` on: the cursor seeks there at once (a restarted learner resumes
        in no time at any position); the jitter stream starts afresh, as it did per incarnation."""
        train, _ = self.corpus.split()
        sampler = ShardSampler(train, shard, shards, self.model_config.block_size, self.batch_size, seed,
                               STREAM + (1 if start else 0), position=start)
        while True:
            yield sampler.next_batch()

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return model(x, y)[1]

    def tokens(self, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
        return batch[0].numel()

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        _, val = self.corpus.split()
        out = list(evaluation_batches(val, self.model_config.block_size, EVAL_BATCH_SIZE))
        if not out:
            raise ValueError(f"{self.corpus.name} has no held-out window of {self.model_config.block_size + 1} bytes")
        return out

    def describe(self) -> dict:
        """What is known about the data, reported beside the loss."""
        c = self.corpus
        return {"data": c.name, "loss_floor": c.entropy_rate, "unigram_entropy": c.unigram_entropy,
                "loss_unit": "nats/byte"}
