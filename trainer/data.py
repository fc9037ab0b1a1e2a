"""Byte-level data: text files or folders, and a synthetic Markov source with a known entropy.

Every learner reads its own shard: every N-th chunk of SHARD_CHUNK bytes of the corpus,
so each shard samples the whole corpus, as a shuffled dataset's shards would, instead of
one contiguous slice of it (a corpus of files in sorted order would give each learner its
own topics, and its local steps between two syncs a drift no data-parallel run has).
Windows are drawn
from a cursor that advances through the shard; the starting jitter is seeded by
(seed, learner, incarnation), and the cursor resumes from the position the syncer
recorded, so a restarted learner continues where its predecessor stopped instead of
replaying the start of its shard.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".json", ".yaml", ".yml", ".csv", ".html", ".tex"}
VALIDATION_FRACTION = 0.05
SHARD_CHUNK = 16 * 1024  # bytes: a window of 65 crosses into an unrelated chunk 0.4% of the time
MAX_CORPUS_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Corpus:
    """A byte corpus plus what is known about its entropy (in nats per byte)."""

    data: np.ndarray  # uint8
    name: str
    unigram_entropy: float
    entropy_rate: float | None  # the loss floor, when the source is known exactly

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """Train and validation parts; the validation tail is never trained on."""
        n_val = max(1, int(len(self.data) * VALIDATION_FRACTION))
        return self.data[:-n_val], self.data[-n_val:]


def unigram_entropy(data: np.ndarray) -> float:
    counts = np.bincount(data, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def load_text(path: str | os.PathLike) -> Corpus:
    """Every text file under `path` (or `path` itself), concatenated in sorted order."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"--data: no such file or folder: {root}")
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    chunks, total = [], 0
    for f in files:
        raw = f.read_bytes()[: MAX_CORPUS_BYTES - total]
        chunks.append(raw)
        total += len(raw)
        if total >= MAX_CORPUS_BYTES:
            break
    data = np.frombuffer(b"\n".join(chunks), dtype=np.uint8).copy()
    if len(data) < 4096:
        raise ValueError(f"--data: {root} holds only {len(data)} bytes of text; need at least 4096")
    return Corpus(data, f"text:{root}", unigram_entropy(data), None)


@dataclass(frozen=True)
class MarkovSource:
    """A seeded order-k Markov chain over a small alphabet, written as letters a, b, c...

    Its entropy rate is computed exactly from the stationary distribution, so the best
    achievable cross-entropy (the loss floor) is known.
    """

    alphabet: int = 16
    order: int = 1
    concentration: float = 0.25
    seed: int = 1234

    def __post_init__(self) -> None:
        if not 2 <= self.alphabet <= 256 - ord("a"):
            raise ValueError(f"--data: markov alphabet must be in [2, {256 - ord('a')}], got {self.alphabet}")
        if not 0 <= self.order <= 4:
            raise ValueError(f"--data: markov order must be in [0, 4], got {self.order}")
        if not self.concentration > 0:
            raise ValueError(f"--data: markov concentration must be > 0, got {self.concentration}")

    def transition_matrix(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        n_ctx = self.alphabet**self.order
        return rng.dirichlet(np.full(self.alphabet, self.concentration), size=n_ctx)

    def stationary(self, trans: np.ndarray) -> np.ndarray:
        """Stationary distribution over contexts, by power iteration on the context chain."""
        n_ctx = trans.shape[0]
        pi = np.full(n_ctx, 1.0 / n_ctx)
        nxt_ctx = (np.arange(n_ctx)[:, None] * self.alphabet + np.arange(self.alphabet)[None, :]) % n_ctx
        for _ in range(10_000):
            new = np.zeros(n_ctx)
            np.add.at(new, nxt_ctx.ravel(), (pi[:, None] * trans).ravel())
            if np.abs(new - pi).sum() < 1e-13:
                return new
            pi = new
        return pi

    def entropy_rate(self) -> float:
        trans = self.transition_matrix()
        pi = self.stationary(trans)
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.nansum(trans * np.log(trans), axis=1)
        return float((pi * h).sum())

    def unigram_entropy(self) -> float:
        trans = self.transition_matrix()
        pi = self.stationary(trans)
        symbol_p = (pi[:, None] * trans).sum(axis=0)
        symbol_p = symbol_p[symbol_p > 0]
        return float(-(symbol_p * np.log(symbol_p)).sum())

    def sample(self, n: int) -> np.ndarray:
        trans = self.transition_matrix()
        cdf = np.cumsum(trans, axis=1)
        rng = np.random.default_rng(self.seed + 1)
        u = rng.random(n)
        out = np.empty(n, dtype=np.int64)
        ctx = 0
        n_ctx = trans.shape[0]
        for i in range(n):
            s = int(np.searchsorted(cdf[ctx], u[i], side="right"))
            s = min(s, self.alphabet - 1)
            out[i] = s
            ctx = (ctx * self.alphabet + s) % n_ctx
        return (out + ord("a")).astype(np.uint8)

    def corpus(self, n_bytes: int = 1_000_000) -> Corpus:
        cache = _cache_path(self, n_bytes)
        if cache is not None and cache.exists():
            data = np.fromfile(cache, dtype=np.uint8)
        else:
            data = self.sample(n_bytes)
            if cache is not None:
                _write_cache(cache, data)
        name = f"markov(alphabet={self.alphabet},order={self.order},seed={self.seed})"
        return Corpus(data, name, self.unigram_entropy(), self.entropy_rate())


def _cache_path(src: MarkovSource, n_bytes: int) -> Path | None:
    root = os.environ.get("ISLANDS_CACHE_DIR", str(Path.home() / ".cache" / "islands"))
    key = f"markov-{src.alphabet}-{src.order}-{src.concentration}-{src.seed}-{n_bytes}.u8"
    return Path(root) / key


def _write_cache(path: Path, data: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        data.tofile(tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # the cache is an optimisation; sampling again is always correct


def load_corpus(spec: str) -> Corpus:
    """`markov` (optionally `markov:alphabet=16,order=2,seed=3`) or a path to text."""
    if spec == "markov" or spec.startswith("markov:"):
        kwargs: dict[str, float | int] = {}
        if ":" in spec:
            for item in spec.split(":", 1)[1].split(","):
                key, _, value = item.partition("=")
                if key not in ("alphabet", "order", "concentration", "seed"):
                    raise ValueError(f"--data: unknown markov option {key!r}")
                try:
                    kwargs[key] = float(value) if key == "concentration" else int(value)
                except ValueError:
                    raise ValueError(f"--data: markov option {key}: expected a number, got {value!r}") from None
        return MarkovSource(**kwargs).corpus()  # type: ignore[arg-type]
    return load_text(spec)


def shard_of(train: np.ndarray, shard: int, num_shards: int, chunk: int = SHARD_CHUNK) -> np.ndarray:
    """Shard `shard` of `num_shards`: chunks shard, shard+N, shard+2N, ... of `chunk` bytes.
    A corpus shorter than N chunks is cut into N equal chunks instead, so no shard is empty."""
    chunk = max(1, min(chunk, len(train) // num_shards))
    starts = range(shard * chunk, len(train), num_shards * chunk)
    return np.concatenate([train[s:s + chunk] for s in starts]) if starts else train[:0]


class ShardSampler:
    """Draws (input, target) windows from one learner's shard, advancing a cursor.

    `position` counts windows already consumed by this learner across incarnations; the
    syncer records it with every push so a restarted learner resumes from it. The R ranks
    of one unit share the shard and its position, each reading its own slice of every step.
    """

    def __init__(self, train: np.ndarray, shard: int, num_shards: int, block_size: int,
                 batch_size: int, seed: int, incarnation: int, position: int = 0,
                 rank: int = 0, ranks: int = 1) -> None:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} is out of range for {num_shards} shards")
        if not 0 <= rank < ranks:
            raise ValueError(f"rank {rank} is out of range for {ranks} ranks")
        self.rank, self.ranks = rank, ranks
        own = shard_of(train, shard, num_shards)
        if len(own) < block_size + 2:
            raise ValueError(f"shard {shard} has {len(own)} bytes, fewer than one window of {block_size + 1}")
        self.tokens = torch.from_numpy(own.astype(np.int64))
        self.block_size = block_size
        self.batch_size = batch_size
        self.position = position
        self._rng = np.random.default_rng([seed, shard, incarnation] + ([rank] if ranks > 1 else []))
        # The batch's windows are spread over the whole shard (one per 1/B of it), and the
        # cursor moves them on by a window per step: each epoch of span/(B·block) steps reads
        # every part of the shard, however short the run.
        self._stride = max(1, (len(self.tokens) - block_size - 1) // max(1, batch_size))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        span = len(self.tokens) - self.block_size - 1
        base = ((self.position * self.ranks + self.rank) * self.block_size) % span
        jitter = self._rng.integers(0, self.block_size, size=self.batch_size)
        starts = (base + np.arange(self.batch_size) * self._stride + jitter) % span
        idx = torch.from_numpy(starts)[:, None] + torch.arange(self.block_size + 1)[None, :]
        windows = self.tokens[idx]
        self.position += 1
        return windows[:, :-1], windows[:, 1:]


# Held-out windows scored at most: 1 MiB at the default 64-byte context, the whole
# validation split of any corpus up to ~20 MB; past that, windows spread evenly over it.
MAX_EVAL_WINDOWS = 16384


def evaluation_batches(val: np.ndarray, block_size: int, batch_size: int,
                       max_windows: int = MAX_EVAL_WINDOWS):
    """Deterministic, non-overlapping windows covering the whole validation split (or, past
    `max_windows`, that many spread evenly across it: never just its first part, which
    once scored 2.52 where the whole split scored 2.90)."""
    tokens = torch.from_numpy(val.astype(np.int64))
    n_windows = (len(tokens) - 1) // block_size
    picked = range(n_windows) if n_windows <= max_windows else \
        [i * n_windows // max_windows for i in range(max_windows)]
    windows = [tokens[i * block_size: i * block_size + block_size + 1] for i in picked]
    for b in range(math.ceil(len(windows) / batch_size)):
        stacked = torch.stack(windows[b * batch_size:(b + 1) * batch_size])
        yield stacked[:, :-1], stacked[:, 1:]
