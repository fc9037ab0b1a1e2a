"""Data (Markov source, text corpora, shard sampler), the model, and the fragment schedule."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import data as data_mod
from trainer.data import Corpus, MarkovSource, ShardSampler, evaluation_batches, load_corpus, load_text
from trainer.fragments import FragmentClock, layer_of, partition, validate_schedule
from trainer.model import ModelConfig, build_model, count_parameters


# ----------------------------------------------------------------------------- Markov source

def _symbols(src: MarkovSource, n: int) -> np.ndarray:
    return src.sample(n).astype(np.int64) - ord("a")


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.fixture(scope="module")
def long_sample() -> tuple[MarkovSource, np.ndarray]:
    src = MarkovSource(alphabet=16, order=1, seed=1234)
    return src, _symbols(src, 200_000)


def test_entropy_rate_matches_empirical_conditional_entropy(long_sample) -> None:
    src, x = long_sample
    a = src.alphabet
    n = len(x) - 1
    counts = np.zeros((a, a))
    np.add.at(counts, (x[:-1], x[1:]), 1)
    p_cond = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    nll = -np.log(p_cond[x[:-1], x[1:]])  # per-symbol plug-in surprisal
    estimate = float(nll.mean())
    # Tolerance: the plug-in estimator is biased low by about (cells - contexts)/(2N)
    # (Miller–Madow), at most (a² - a)/(2N) here; its standard error is about
    # std(surprisal)/sqrt(N) (the surprisal minus its context mean is a martingale
    # difference); we allow 5 standard errors, and 0.01 nats for the chain starting in
    # context 0 rather than in the stationary distribution and for mixing.
    tol = (a * a - a) / (2 * n) + 5 * float(nll.std()) / math.sqrt(n) + 0.01
    assert abs(estimate - src.entropy_rate()) < tol, (estimate, src.entropy_rate(), tol)


def test_entropy_rate_matches_cross_entropy_under_true_transitions(long_sample) -> None:
    src, x = long_sample
    trans = src.transition_matrix()
    nll = -np.log(trans[x[:-1], x[1:]])
    tol = 5 * float(nll.std()) / math.sqrt(len(nll)) + 0.01
    assert abs(float(nll.mean()) - src.entropy_rate()) < tol


def test_unigram_entropy_matches_empirical(long_sample) -> None:
    src, x = long_sample
    counts = np.bincount(x, minlength=src.alphabet).astype(float)
    estimate = _entropy(counts)
    tol = (src.alphabet - 1) / (2 * len(x)) + 0.02  # bias + a generous allowance for correlation
    assert abs(estimate - src.unigram_entropy()) < tol
    assert abs(data_mod.unigram_entropy((x + ord("a")).astype(np.uint8)) - estimate) < 1e-9


def test_entropy_rate_is_below_unigram_and_log_alphabet() -> None:
    src = MarkovSource(alphabet=16, order=1, seed=1234)
    assert 0 < src.entropy_rate() < src.unigram_entropy() <= math.log(16) + 1e-12


@pytest.mark.parametrize("alphabet,order", [(16, 1), (4, 2), (3, 3)])
def test_stationary_distribution(alphabet: int, order: int) -> None:
    src = MarkovSource(alphabet=alphabet, order=order, seed=5)
    trans = src.transition_matrix()
    assert trans.shape == (alphabet**order, alphabet)
    np.testing.assert_allclose(trans.sum(axis=1), 1.0, atol=1e-12)
    pi = src.stationary(trans)
    assert abs(pi.sum() - 1.0) < 1e-9
    assert (pi >= 0).all()
    # Invariance under the context chain, written out independently: context c = (…, b)
    # followed by symbol s moves to context (c·A + s) mod A^k.
    n_ctx = alphabet**order
    moved = np.zeros(n_ctx)
    for c in range(n_ctx):
        for s in range(alphabet):
            moved[(c * alphabet + s) % n_ctx] += pi[c] * trans[c, s]
    np.testing.assert_allclose(moved, pi, atol=1e-9)


def test_order_zero_source_is_iid_or_refused() -> None:
    src = MarkovSource(alphabet=4, order=0, seed=2)
    try:
        rate = src.entropy_rate()
    except ValueError as exc:
        assert "order" in str(exc)
    else:
        assert abs(rate - src.unigram_entropy()) < 1e-9


def test_sample_is_deterministic_and_in_alphabet() -> None:
    src = MarkovSource(alphabet=5, order=2, seed=9)
    a, b = src.sample(2000), src.sample(2000)
    assert a.dtype == np.uint8 and np.array_equal(a, b)
    assert set(np.unique(a)) <= set(range(ord("a"), ord("a") + 5))
    assert not np.array_equal(a, MarkovSource(alphabet=5, order=2, seed=10).sample(2000))


# ----------------------------------------------------------------------------- load_corpus

def test_load_corpus_parses_markov_options(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[MarkovSource] = []
    monkeypatch.setattr(MarkovSource, "corpus", lambda self, n_bytes=0: built.append(self) or "corpus")
    assert load_corpus("markov:order=1,seed=3") == "corpus"
    assert built[-1] == MarkovSource(alphabet=16, order=1, concentration=0.25, seed=3)
    load_corpus("markov:alphabet=4,order=2,concentration=0.5,seed=7")
    assert built[-1] == MarkovSource(alphabet=4, order=2, concentration=0.5, seed=7)
    assert isinstance(built[-1].concentration, float) and isinstance(built[-1].order, int)
    load_corpus("markov")
    assert built[-1] == MarkovSource()


@pytest.mark.parametrize("spec,option", [("markov:depth=2", "depth"), ("markov:order=1,colour=red", "colour")])
def test_load_corpus_unknown_option_is_named(spec: str, option: str) -> None:
    with pytest.raises(ValueError, match=f"--data: unknown markov option '{option}'"):
        load_corpus(spec)


def test_load_corpus_bad_value_names_the_option() -> None:
    with pytest.raises(ValueError, match="order"):
        load_corpus("markov:order=two")


def test_markov_corpus_uses_and_fills_the_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ISLANDS_CACHE_DIR", str(tmp_path))
    src = MarkovSource(alphabet=4, order=1, seed=3)
    first = src.corpus(n_bytes=5000)
    assert len(first.data) == 5000 and first.data.dtype == np.uint8
    assert "order=1" in first.name and "seed=3" in first.name
    assert first.entropy_rate == pytest.approx(src.entropy_rate())
    assert first.unigram_entropy == pytest.approx(src.unigram_entropy())
    assert len(list(tmp_path.iterdir())) == 1
    again = src.corpus(n_bytes=5000)
    assert np.array_equal(first.data, again.data)
    assert np.array_equal(first.data, src.sample(5000))


# ----------------------------------------------------------------------------- text

def test_load_text_folder(tmp_path) -> None:
    files = {"b.txt": b"B" * 2000, "a.md": b"A" * 1500, "sub/c.py": b"print(1)\n" * 100}
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    (tmp_path / "skip.bin").write_bytes(b"\x00" * 10_000)  # not a text suffix
    corpus = load_text(tmp_path)
    expected = b"\n".join(files[k] for k in sorted(files, key=lambda k: str(tmp_path / k)))
    assert corpus.data.tobytes() == expected
    assert corpus.entropy_rate is None and corpus.name == f"text:{tmp_path}"
    counts = np.bincount(np.frombuffer(expected, np.uint8), minlength=256).astype(float)
    assert corpus.unigram_entropy == pytest.approx(_entropy(counts))
    assert load_corpus(str(tmp_path)).data.tobytes() == expected


def test_load_text_single_file(tmp_path) -> None:
    path = tmp_path / "book.bin"  # a file given directly is read whatever its suffix
    path.write_bytes(bytes(range(256)) * 20)
    assert load_text(path).data.tobytes() == bytes(range(256)) * 20


def test_load_text_too_small(tmp_path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match=r"--data: .*100 bytes.*4096"):
        load_text(tmp_path)


def test_load_text_missing(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--data"):
        load_corpus(str(tmp_path / "nothing-here"))


def test_corpus_split_keeps_a_tail() -> None:
    arr = np.arange(1000, dtype=np.int64).astype(np.uint8)
    train, val = Corpus(arr, "x", 0.0, None).split()
    assert len(val) == 50 and len(train) == 950
    assert np.array_equal(np.concatenate([train, val]), arr)


def test_evaluation_batches_are_non_overlapping_windows() -> None:
    val = (np.arange(10 * 8 + 1) % 251).astype(np.uint8)
    batches = list(evaluation_batches(val, block_size=8, batch_size=4))
    xs = torch.cat([x for x, _ in batches])
    assert xs.shape == (10, 8)
    assert torch.equal(xs.reshape(-1), torch.from_numpy(val[:80].astype(np.int64)))
    for x, y in batches:
        assert torch.equal(x[:, 1:], y[:, :-1])


# ----------------------------------------------------------------------------- shard sampler

def _sharded(num_shards: int, shard_len: int) -> np.ndarray:
    # Shard i holds only byte values in [60 i, 60 i + 50): disjoint value ranges per shard.
    return np.concatenate([(60 * i + np.arange(shard_len) % 50).astype(np.uint8) for i in range(num_shards)])


def test_shards_of_different_learners_do_not_overlap() -> None:
    train = _sharded(3, 2000)
    seen = []
    for shard in range(3):
        s = ShardSampler(train, shard, 3, block_size=16, batch_size=8, seed=1, incarnation=1)
        values = set()
        for _ in range(20):
            x, y = s.next_batch()
            assert x.shape == (8, 16) and y.shape == (8, 16)
            assert torch.equal(x[:, 1:], y[:, :-1]), "targets are inputs shifted by one"
            values |= set(x.unique().tolist()) | set(y.unique().tolist())
        assert values <= set(range(60 * shard, 60 * shard + 50)), f"shard {shard} read outside its slice"
        seen.append(values)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_windows_are_contiguous_text() -> None:
    train = (np.arange(5000) % 251).astype(np.uint8)  # each byte determines its successor
    s = ShardSampler(train, 0, 1, block_size=10, batch_size=4, seed=0, incarnation=1)
    x, y = s.next_batch()
    full = torch.cat([x, y[:, -1:]], dim=1)
    assert torch.equal((full[:, 1:] - full[:, :-1]) % 251, torch.ones(4, 10, dtype=torch.int64))


def test_same_seed_shard_incarnation_position_reproduce() -> None:
    train = np.random.default_rng(0).integers(0, 256, 20_000).astype(np.uint8)
    a = ShardSampler(train, 1, 2, 16, 8, seed=5, incarnation=2, position=7)
    b = ShardSampler(train, 1, 2, 16, 8, seed=5, incarnation=2, position=7)
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other = ShardSampler(train, 1, 2, 16, 8, seed=5, incarnation=3, position=7)
    assert not torch.equal(other.next_batch()[0], ShardSampler(train, 1, 2, 16, 8, 5, 2, 7).next_batch()[0])


def test_position_advances_and_resumed_sampler_does_not_replay() -> None:
    train = np.random.default_rng(1).integers(0, 256, 50_000).astype(np.uint8)
    s = ShardSampler(train, 0, 1, 16, 8, seed=3, incarnation=1)
    first = [s.next_batch()[0] for _ in range(6)]
    assert s.position == 6
    resumed = ShardSampler(train, 0, 1, 16, 8, seed=3, incarnation=2, position=s.position)
    batch = resumed.next_batch()[0]
    assert resumed.position == 7
    fresh = ShardSampler(train, 0, 1, 16, 8, seed=3, incarnation=2, position=0).next_batch()[0]
    assert not torch.equal(batch, fresh), "a restarted learner must not replay the start of its shard"
    # Windows drawn at consecutive positions start at different places in the shard.
    assert all(not torch.equal(first[i], first[i + 1]) for i in range(5))


def test_sampler_validation() -> None:
    train = np.zeros(1000, dtype=np.uint8)
    with pytest.raises(ValueError, match="shard 3 is out of range"):
        ShardSampler(train, 3, 3, 16, 4, 0, 1)
    with pytest.raises(ValueError, match="fewer than one window"):
        ShardSampler(train, 0, 100, 16, 4, 0, 1)


# ----------------------------------------------------------------------------- model

def test_default_model_size() -> None:
    model = build_model(ModelConfig(), seed=0)
    n = count_parameters(model)
    assert 500_000 <= n <= 2_000_000
    assert n == sum(p.numel() for p in model.parameters())


def test_forward_shapes_and_initial_loss() -> None:
    torch.set_num_threads(1)
    cfg = ModelConfig(n_layer=2, n_embd=32, n_head=4, block_size=16)
    model = build_model(cfg, seed=1)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (3, 16), generator=g)
    targets = torch.randint(0, 256, (3, 16), generator=g)  # unrelated to the inputs
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, 256)
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    # Small initial weights give nearly uniform predictions: loss close to ln(vocab).
    assert abs(float(loss.detach()) - math.log(256)) < 0.3
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                                                       targets.reshape(-1)))
    logits2, none = model(idx[:, :5])
    assert logits2.shape == (3, 5, 256) and none is None
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_model_is_causal() -> None:
    cfg = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
    model = build_model(cfg, seed=2).eval()
    a = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    b = a.clone()
    b[0, 5:] = (b[0, 5:] + 1) % 256
    la, _ = model(a)
    lb, _ = model(b)
    torch.testing.assert_close(la[0, :5], lb[0, :5])
    assert not torch.allclose(la[0, 5:], lb[0, 5:])


def test_build_model_is_deterministic_and_leaves_global_rng_alone() -> None:
    cfg = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    m1 = build_model(cfg, seed=4)
    assert torch.equal(torch.rand(3), expected_next), "build_model must restore the global RNG"
    m2 = build_model(cfg, seed=4)
    m3 = build_model(cfg, seed=5)
    p1, p2, p3 = (dict(m.named_parameters()) for m in (m1, m2, m3))
    assert all(torch.equal(p1[n], p2[n]) for n in p1)
    assert any(not torch.equal(p1[n], p3[n]) for n in p1)


@pytest.mark.parametrize("kwargs,field", [
    ({"vocab_size": 0}, "model.vocab_size"), ({"block_size": 0}, "model.block_size"),
    ({"n_layer": 0}, "model.n_layer"), ({"n_head": 0}, "model.n_head"), ({"n_embd": -1}, "model.n_embd"),
    ({"n_embd": 30, "n_head": 4}, "model.n_embd"), ({"dropout": 1.0}, "model.dropout"),
    ({"dropout": -0.1}, "model.dropout"),
])
def test_model_config_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        ModelConfig(**kwargs)


def test_model_config_dict_round_trip() -> None:
    cfg = ModelConfig(n_layer=2, n_embd=32, n_head=4)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


# ----------------------------------------------------------------------------- fragments

@pytest.fixture(scope="module")
def default_shapes() -> dict[str, torch.Size]:
    return {n: p.shape for n, p in build_model(ModelConfig(), 0).named_parameters()}


def _check_partition(shapes: dict[str, torch.Size], p: int) -> None:
    frags = partition(shapes, p)
    assert [f.index for f in frags] == list(range(p))
    names = [n for f in frags for n in f.names]
    assert sorted(names) == sorted(shapes) and len(names) == len(set(names)), "each name exactly once"
    order = list(shapes)
    sizes = {n: math.prod(s) for n, s in shapes.items()}
    for f in frags:
        assert f.names and list(f.names) == sorted(f.names, key=order.index), "model order inside a fragment"
        assert f.numel == sum(sizes[n] for n in f.names)
    loads = [f.numel for f in frags]
    # Greedy to-the-lightest assignment: when the heaviest bin got its last tensor it was
    # the lightest, so max − min never exceeds the largest tensor.
    assert max(loads) - min(loads) <= max(sizes.values())


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_partition_of_default_model(default_shapes, p: int) -> None:
    _check_partition(default_shapes, p)
    loads = [f.numel for f in partition(default_shapes, p)]
    if p <= 4:  # the default model's tensors are small enough to balance within 1.5x
        assert max(loads) / min(loads) <= 1.5, loads


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=25),
       st.integers(1, 25))
def test_partition_properties(dims: list[list[int]], p: int) -> None:
    shapes = {f"t{i}": torch.Size(d) for i, d in enumerate(dims)}
    if p > len(shapes):
        with pytest.raises(ValueError, match="fragments"):
            partition(shapes, p)
    else:
        _check_partition(shapes, p)


def test_partition_is_deterministic(default_shapes) -> None:
    assert partition(default_shapes, 3) == partition(dict(default_shapes), 3)


def test_partition_errors(default_shapes) -> None:
    with pytest.raises(ValueError, match=r"fragments: 99 exceeds the \d+ parameter tensors"):
        partition(default_shapes, 99)
    with pytest.raises(ValueError, match="fragments: must be >= 1"):
        partition(default_shapes, 0)


@pytest.mark.parametrize("h,p", [(12, 1), (12, 3), (12, 4), (20, 5), (8, 8)])
def test_fragment_clock_staggers_and_repeats_every_h(h: int, p: int) -> None:
    clock = FragmentClock(h, p)
    pushes: dict[int, list[int]] = {f: [] for f in range(p)}
    for step in range(1, 5 * h + 1):
        for f in clock.due(step):
            pushes[f].append(step)
            clock.synced(f, step)  # the learner pushes whatever falls due
    stride = h // p
    for f in range(p):
        assert pushes[f] == list(range((f + 1) * stride, 5 * h + 1, h)), f
    # Every window of H consecutive steps holds exactly one push of every fragment.
    for start in range(h, 4 * h + 1):
        window = range(start, start + h)
        assert all(sum(s in window for s in pushes[f]) == 1 for f in range(p))


def test_fragment_clock_restarts_from_an_adoption() -> None:
    clock = FragmentClock(10, 2)
    assert clock.due(4) == [] and clock.due(5) == [0] and clock.due(10) == [0, 1]
    clock.synced(0, 5)
    clock.synced(1, 10)
    clock.synced(0, 12)  # adopted a new global version of fragment 0 at step 12
    assert clock.due(21) == [1] and clock.due(22) == [0, 1]


@pytest.mark.parametrize("h,p,tau,match", [
    (10, 3, 0, r"fragments \(P\): 3 must divide sync_every \(H\) = 10"),
    (0, 1, 0, r"sync_every \(H\): must be >= 1"),
    (12, 3, 4, r"overlap \(tau\): must be in \[0, H/P\) = \[0, 4\), got 4"),
    (12, 3, -1, r"overlap \(tau\)"),
])
def test_validate_schedule_errors(h: int, p: int, tau: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_schedule(h, p, tau)


@pytest.mark.parametrize("h,p,tau", [(12, 3, 3), (12, 3, 0), (1, 1, 0), (20, 4, 4)])
def test_validate_schedule_accepts(h: int, p: int, tau: int) -> None:
    validate_schedule(h, p, tau)


def test_pull_encoding_is_validated_naming_the_field() -> None:
    from trainer.config import TrainConfig
    assert TrainConfig(pull_encoding="bf16").pull_encoding == "bf16"
    with pytest.raises(ValueError, match="pull-encoding: must be one of fp32, bf16, delta-int8, delta-int4, got 'int4'"):
        TrainConfig(pull_encoding="int4")


def test_strided_fragments_interleave_the_layers_and_pack_the_rest(default_shapes) -> None:
    frags = partition(default_shapes, 2, "strided")
    for f in frags:
        layers = {layer_of(n) for n in f.names} - {None}
        assert layers == {f.index, f.index + 2}, "layer i goes to fragment i mod P"
    names = [n for f in frags for n in f.names]
    assert sorted(names) == sorted(default_shapes) and len(names) == len(set(names))
    # The embeddings and final norm (no layer number) balance the fragments' sizes.
    loads = [f.numel for f in partition(default_shapes, 4, "strided")]
    assert max(loads) / min(loads) <= 1.2, loads


def test_strided_fragments_need_a_layer_per_fragment() -> None:
    shapes = {n: p.shape for n, p in build_model(ModelConfig(n_layer=2, n_embd=16, n_head=2), 0).named_parameters()}
    with pytest.raises(ValueError, match="fragment-layout: strided needs at least as many numbered layers as "
                                         "fragments; the model has 2 .0, 1. for 4 fragments"):
        partition(shapes, 4, "strided")
    with pytest.raises(ValueError, match="fragment-layout: must be one of balanced, strided"):
        partition(shapes, 2, "zigzag")


@pytest.mark.parametrize("name, layer", [("blocks.3.attn.qkv.weight", 3), ("model.layers.11.mlp.w", 11),
                                         ("h.0.ln_1.bias", 0), ("tok_emb.weight", None), ("ln_f.bias", None),
                                         ("w2v.weight", None)])
def test_layer_of_reads_the_first_numbered_component(name: str, layer: int | None) -> None:
    assert layer_of(name) == layer


def test_a_run_of_a_few_hundred_steps_reads_the_whole_shard() -> None:
    """Windows spread over the whole shard: before issue 18 a run at the bench's budget read
    only the first third of each learner's shard."""
    shard = np.random.default_rng(0).integers(0, 256, size=100_000, dtype=np.uint8)
    where = {shard[i:i + 8].tobytes(): i for i in range(len(shard) - 8)}  # random 8-byte keys: unique
    sampler = ShardSampler(shard, 0, 1, block_size=64, batch_size=8, seed=0, incarnation=1)
    seen = np.zeros(len(shard), dtype=bool)
    for _ in range(len(shard) // (8 * 64) + 1):  # one epoch's worth of windows
        x, _ = sampler.next_batch()
        for row in x.numpy().astype(np.uint8):
            start = where[row[:8].tobytes()]
            seen[start:start + 64] = True
    assert seen.mean() > 0.6, f"only {seen.mean():.0%} of the shard was read in an epoch's worth of steps"
    assert seen[-10_000:].mean() > 0.6 and seen[:10_000].mean() > 0.6, "both ends of the shard are read"
