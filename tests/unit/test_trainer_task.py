"""The Task API (trainer/task.py): loading a task, the checks around every call, preflight;
the built-in gpt task; and the run's typed settings around it (device.py, runspec.py, the
launcher's restart backoff).

Task files are written into tmp_path, so the loader runs on real files; the checks use
small in-process tasks, each broken in one way.
"""
from __future__ import annotations

import importlib
import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from trainer import launch
from trainer.__main__ import task_failures
from trainer.device import check_device, resolve_device
from trainer.events import EventLog, read_events
from trainer.learner import TASK_EXIT, report_task_error
from trainer.model import ModelConfig, build_model
from trainer.runspec import RunSpec
from trainer.task import CheckedTask, TaskError, load_task, preflight

GOOD_SOURCE = """
import torch
import torch.nn.functional as F


class Good:
    def model(self):
        return torch.nn.Linear(4, 2)

    def batches(self, shard, shards, seed):
        i = 0
        while True:
            yield torch.full((3, 4), float(i)), torch.zeros(3, dtype=torch.long)
            i += 1

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch):
        return len(batch[1])

    def eval_batches(self):
        return [(torch.ones(3, 4), torch.zeros(3, dtype=torch.long))]
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The loader puts a task file's folder on sys.path, and some tests seed torch: keep
    both out of other tests."""
    monkeypatch.setattr(sys, "path", [*sys.path])
    with torch.random.fork_rng(devices=[]):
        yield


def _write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _load_error(spec: str) -> TaskError:
    with pytest.raises(TaskError) as info:
        load_task(spec)
    return info.value


# ----------------------------------------------------------------------------- in-process tasks
class Good:
    """A minimal correct task: batch i is (x filled with i, zero labels)."""

    def model(self) -> torch.nn.Module:
        return torch.nn.Linear(4, 2)

    def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
        i = 0
        while True:
            yield torch.full((3, 4), float(i)), torch.zeros(3, dtype=torch.long)
            i += 1

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def tokens(self, batch: Any) -> int:
        return len(batch[1])

    def eval_batches(self) -> list[Any]:
        return [(torch.ones(3, 4), torch.zeros(3, dtype=torch.long))]


class LossShape(Good):
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return torch.zeros(8, requires_grad=True)


class LossFloat(Good):
    def loss(self, model: torch.nn.Module, batch: Any) -> Any:
        return 0.5


class LossInt(Good):
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return torch.tensor(3)


class LossRaises(Good):
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        raise KeyError("labels")


class LossNaN(Good):
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return model(batch[0]).sum() * float("nan")


class BatchesEnd(Good):
    def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
        yield from [(torch.ones(3, 4), torch.zeros(3, dtype=torch.long))] * 2


class BatchesEmpty(Good):
    def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
        return iter(())


class BatchesString(Good):
    def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
        while True:
            yield "not a batch"


class BatchesNotIterable(Good):
    def batches(self, shard: int, shards: int, seed: int) -> Any:
        return 42


class TokensZero(Good):
    def tokens(self, batch: Any) -> int:
        return 0


class TokensFloat(Good):
    def tokens(self, batch: Any) -> Any:
        return 3.0


class TokensBool(Good):
    def tokens(self, batch: Any) -> Any:
        return True


class TokensTensor(Good):
    def tokens(self, batch: Any) -> Any:
        return torch.tensor(5)


class EvalEmpty(Good):
    def eval_batches(self) -> list[Any]:
        return []


class EvalNaN(Good):
    """Finite on training batches, NaN on the held-out one."""

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        out = super().loss(model, batch)
        return out * float("nan") if not model.training else out


class MetricsList(Good):
    def metrics(self, model: torch.nn.Module, batch: Any) -> Any:
        return [0.5]


class MetricsBadValue(Good):
    def metrics(self, model: torch.nn.Module, batch: Any) -> Any:
        return {"accuracy": "high"}


class MetricsGood(Good):
    def metrics(self, model: torch.nn.Module, batch: Any) -> dict[str, Any]:
        return {"accuracy": torch.tensor(0.25), "count": 3}


class ModelString(Good):
    def model(self) -> Any:
        return "resnet"


class ModelFrozen(Good):
    def model(self) -> torch.nn.Module:
        m = torch.nn.Linear(4, 2)
        for p in m.parameters():
            p.requires_grad_(False)
        return m


class ModelRaises(Good):
    def model(self) -> torch.nn.Module:
        torch.rand(1)  # moves the RNG before failing: the caller's state must still come back
        raise RuntimeError("out of memory")


class OptimizerWrong(Good):
    def inner_optimizer(self, params: list[torch.nn.Parameter]) -> Any:
        return {"lr": 0.1}


class OptimizerSGD(Good):
    def inner_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)


class DescribeList(Good):
    def describe(self) -> Any:
        return ["data"]


def _checked(task: Any, spec: str = "t") -> CheckedTask:
    return CheckedTask(task, spec)


def _error(fn) -> TaskError:
    with pytest.raises(TaskError) as info:
        fn()
    return info.value


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(3, 4), torch.zeros(3, dtype=torch.long)


# ----------------------------------------------------------------------------- loader
def test_missing_attribute_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "notask.py", GOOD_SOURCE)
    err = _load_error(f"{path}:task")
    assert "no attribute 'task'" in str(err), str(err)
    assert err.task == f"{path}:task"


@pytest.mark.parametrize("spec", ["tasks.py", "tasks.py:", ":task", "tasks.py:not-a-name"])
def test_spec_without_name_names_the_flag(spec: str) -> None:
    err = _load_error(spec)
    assert str(err).startswith(f"--task {spec}: expected FILE.py:NAME or MODULE:NAME"), str(err)
    assert "gpt" in str(err), "the message should list the built-in tasks"


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    err = _load_error(f"{missing}:task")
    assert f"no such file: {missing}" in str(err), str(err)


def test_import_that_raises_names_the_exception_and_keeps_the_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "explodes.py", """
        def _open_dataset():
            raise RuntimeError("dataset server unreachable")

        _open_dataset()
        task = None
    """)
    err = _load_error(f"{path}:task")
    assert f"importing {path} raised RuntimeError: dataset server unreachable" in str(err), str(err)
    assert err.method == "import"
    assert "Traceback" in err.details and "_open_dataset" in err.details, err.details
    assert str(path) in err.details, "the traceback should point into the task file"


def test_import_failure_is_not_cached(tmp_path: Path) -> None:
    """A file fixed after a failed import loads: the broken module is not kept."""
    path = _write(tmp_path, "fixme.py", "raise ImportError('not yet')\n")
    _load_error(f"{path}:Good")
    path.write_text(GOOD_SOURCE)
    assert type(load_task(f"{path}:Good").task).__name__ == "Good"


def test_object_missing_loss_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "noloss.py", GOOD_SOURCE + """
class NoLoss(Good):
    loss = None
""")
    err = _load_error(f"{path}:NoLoss")
    assert "has no method 'loss'" in str(err), str(err)
    assert err.method == "loss"


def test_instance_missing_eval_batches_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "noeval.py", """
        import torch

        class Partial:
            def model(self): return torch.nn.Linear(2, 2)
            def batches(self, shard, shards, seed): yield torch.ones(2)
            def loss(self, model, batch): return model(batch).sum()
            def tokens(self, batch): return 1

        task = Partial()
    """)
    err = _load_error(f"{path}:task")
    assert "has no method 'eval_batches'" in str(err), str(err)


def test_a_class_is_instantiated(tmp_path: Path) -> None:
    path = _write(tmp_path, "cls.py", GOOD_SOURCE + "\ntask = Good\n")
    checked = load_task(f"{path}:task")
    assert isinstance(checked, CheckedTask)
    assert not isinstance(checked.task, type), "the class itself was used, not an instance"
    assert type(checked.task).__name__ == "Good"
    assert checked.spec == f"{path}:task"


def test_an_instance_is_used_as_is(tmp_path: Path) -> None:
    path = _write(tmp_path, "inst.py", GOOD_SOURCE + "\ntask = Good()\ntask.marker = 'same'\n")
    assert getattr(load_task(f"{path}:task").task, "marker", None) == "same"


def test_a_zero_argument_function_returning_a_task_works(tmp_path: Path) -> None:
    path = _write(tmp_path, "factory.py", GOOD_SOURCE + """
def make_task():
    t = Good()
    t.made_by = "make_task"
    return t
""")
    checked = load_task(f"{path}:make_task")
    assert getattr(checked.task, "made_by", None) == "make_task"
    assert preflight(checked, seed=0)["tokens_per_batch"] == 3


def test_a_constructor_that_raises_names_the_call(tmp_path: Path) -> None:
    path = _write(tmp_path, "ctor.py", GOOD_SOURCE + """
class Needy(Good):
    def __init__(self):
        raise FileNotFoundError("weights.pt")
""")
    err = _load_error(f"{path}:Needy")
    assert "calling Needy() raised FileNotFoundError: weights.pt" in str(err), str(err)
    assert f'{path}", line' in err.details and "in __init__" in err.details, err.details


def test_module_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"islands_test_task_{uuid.uuid4().hex[:8]}"
    _write(tmp_path, f"{name}.py", GOOD_SOURCE + "\ntask = Good\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        checked = load_task(f"{name}:task")
        assert type(checked.task).__name__ == "Good"
        assert type(checked.task).__module__ == name
    finally:
        sys.modules.pop(name, None)


def test_module_form_missing_module_names_it() -> None:
    name = f"islands_no_such_module_{uuid.uuid4().hex[:8]}"
    err = _load_error(f"{name}:task")
    assert f"no module named {name!r}" in str(err), str(err)


# ----------------------------------------------------------------------------- loss checks
def test_loss_of_shape_8_is_refused_with_its_shape() -> None:
    task = _checked(LossShape())
    err = _error(lambda: task.loss(task.model(0), _batch()))
    assert "task.loss returned a tensor of shape (8,), expected a scalar" in str(err), str(err)
    assert str(err).startswith("task t: "), "the message should name the task first"
    assert (err.task, err.method) == ("t", "loss")


def test_loss_returning_a_float_is_refused() -> None:
    task = _checked(LossFloat())
    err = _error(lambda: task.loss(task.model(0), _batch()))
    assert "task.loss returned float, expected a scalar tensor" in str(err), str(err)


def test_loss_of_integer_dtype_is_refused() -> None:
    task = _checked(LossInt())
    err = _error(lambda: task.loss(task.model(0), _batch()))
    assert "torch.int64 tensor, expected a floating-point scalar" in str(err), str(err)


def test_loss_that_raises_names_the_exception() -> None:
    task = _checked(LossRaises())
    err = _error(lambda: task.loss(task.model(0), _batch()))
    assert "task.loss raised KeyError: 'labels'" in str(err), str(err)
    assert 'raise KeyError("labels")' in err.details, err.details


def test_good_loss_passes_through() -> None:
    task = _checked(Good())
    model = task.model(0)
    out = task.loss(model, _batch())
    assert out.dim() == 0 and out.requires_grad


@pytest.mark.parametrize("value,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_check_finite_refuses_non_finite_losses(value: float, shown: str) -> None:
    err = _error(lambda: _checked(Good()).check_finite(value, 17))
    assert f"task.loss returned {shown} at step 17" in str(err), str(err)
    assert err.method == "loss"


def test_check_finite_accepts_finite_losses() -> None:
    _checked(Good()).check_finite(2.5, 0)
    _checked(Good()).check_finite(0.0, 1)


# ----------------------------------------------------------------------------- batches checks
def test_exception_inside_batches_names_shard_and_keeps_the_user_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "shards.py", GOOD_SOURCE + """
def _read_shard_records(shard):
    if shard == 1:
        raise ValueError("corrupt record 3 in shard-1.bin")
    return torch.ones(3, 4)


class Sharded(Good):
    def batches(self, shard, shards, seed):
        while True:
            yield _read_shard_records(shard), torch.zeros(3, dtype=torch.long)
""")
    task = load_task(f"{path}:Sharded")
    assert next(task.batches(0, 2, 0))[0].shape == (3, 4), "shard 0 should be readable"
    err = _error(lambda: next(task.batches(1, 2, 0)))
    assert "task.batches(shard=1) raised ValueError: corrupt record 3 in shard-1.bin" in str(err), str(err)
    assert err.method == "batches"
    assert "_read_shard_records" in err.details and str(path) in err.details, err.details


def test_batches_that_end_must_be_endless() -> None:
    it = _checked(BatchesEnd()).batches(0, 1, 0)
    next(it), next(it)
    err = _error(lambda: next(it))
    assert "task.batches(shard=0) ended after 2 batches; it must be endless" in str(err), str(err)


def test_batches_that_yield_nothing() -> None:
    err = _error(lambda: next(_checked(BatchesEmpty()).batches(0, 1, 0)))
    assert "ended after 0 batches" in str(err), str(err)


def test_batches_not_iterable() -> None:
    err = _error(lambda: _checked(BatchesNotIterable()).batches(0, 1, 0))
    assert "task.batches(shard=0) raised TypeError" in str(err), str(err)


def test_a_string_batch_is_refused() -> None:
    err = _error(lambda: next(_checked(BatchesString()).batches(0, 1, 0)))
    assert "task.batches(shard=0) yielded str, expected a tensor or a tuple, list or dict of tensors" in str(err), \
        str(err)
    assert err.method == "batches"


@pytest.mark.parametrize("batch,kind", [((), "tuple"), ({}, "dict"), ((torch.ones(2), 3), "int"),
                                        ({"x": torch.ones(2), "y": [torch.ones(1), None]}, "NoneType")])
def test_batches_holding_a_non_tensor_are_refused(batch: Any, kind: str) -> None:
    class Odd(Good):
        def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
            while True:
                yield batch

    err = _error(lambda: next(_checked(Odd()).batches(0, 1, 0)))
    assert f"yielded {kind}, expected a tensor" in str(err), str(err)


@pytest.mark.parametrize("batch", [torch.ones(2), (torch.ones(2), torch.ones(1)), [torch.ones(2)],
                                   {"x": torch.ones(2), "y": (torch.ones(1), [torch.ones(1)])}])
def test_nested_tensor_batches_are_accepted(batch: Any) -> None:
    class Nested(Good):
        def batches(self, shard: int, shards: int, seed: int) -> Iterator[Any]:
            while True:
                yield batch

    assert next(_checked(Nested()).batches(0, 1, 0)) is batch


@pytest.mark.parametrize("skip", [0, 1, 5])
def test_skip_resumes_at_the_next_batch(skip: int) -> None:
    it = _checked(Good()).batches(0, 1, 0, skip=skip)
    assert float(next(it)[0][0, 0]) == float(skip), f"skip={skip} should resume at batch {skip + 1}"
    assert float(next(it)[0][0, 0]) == float(skip + 1)


# ----------------------------------------------------------------------------- tokens, eval, metrics
@pytest.mark.parametrize("task,shown", [(TokensZero(), "0"), (TokensFloat(), "3.0"), (TokensBool(), "True")])
def test_bad_tokens_are_refused(task: Good, shown: str) -> None:
    err = _error(lambda: _checked(task).tokens(_batch()))
    assert f"task.tokens returned {shown}, expected an integer >= 1" in str(err), str(err)
    assert err.method == "tokens"


def test_tokens_as_an_integer_tensor_is_accepted() -> None:
    out = _checked(TokensTensor()).tokens(_batch())
    assert out == 5 and type(out) is int


def test_empty_eval_batches_are_refused() -> None:
    err = _error(lambda: _checked(EvalEmpty()).eval_batches())
    assert "task.eval_batches() yielded no batch" in str(err), str(err)
    assert err.method == "eval_batches"


def test_endless_eval_batches_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.task as task_mod
    monkeypatch.setattr(task_mod, "MAX_EVAL_BATCHES", 5)

    class Endless(Good):
        def eval_batches(self) -> Iterator[Any]:
            return self.batches(0, 1, 0)

    err = _error(lambda: _checked(Endless()).eval_batches())
    assert "yielded more than 5 batches; it must be a finite held-out set" in str(err), str(err)


def test_eval_batches_are_listed() -> None:
    out = _checked(Good()).eval_batches()
    assert isinstance(out, list) and len(out) == 1


def test_metrics_returning_a_list_is_refused() -> None:
    task = _checked(MetricsList())
    err = _error(lambda: task.metrics(task.model(0), _batch()))
    assert "task.metrics returned list, expected a dict of floats" in str(err), str(err)


def test_metrics_with_a_string_value_is_refused() -> None:
    task = _checked(MetricsBadValue())
    err = _error(lambda: task.metrics(task.model(0), _batch()))
    assert "task.metrics returned 'accuracy': 'high'" in str(err), str(err)


def test_metrics_become_floats_and_are_optional() -> None:
    task = _checked(MetricsGood())
    assert task.has_metrics
    assert task.metrics(task.model(0), _batch()) == {"accuracy": 0.25, "count": 3.0}
    plain = _checked(Good())
    assert not plain.has_metrics
    assert plain.metrics(plain.model(0), _batch()) == {}


def test_describe_defaults_and_is_checked() -> None:
    assert _checked(Good(), "my.py:task").describe() == {"data": "my.py:task"}
    err = _error(lambda: _checked(DescribeList()).describe())
    assert "task.describe returned list, expected a dict" in str(err), str(err)


# ----------------------------------------------------------------------------- optimizer and model
def test_inner_optimizer_returning_a_non_optimizer_is_refused() -> None:
    task = _checked(OptimizerWrong())
    params = list(task.model(0).parameters())
    err = _error(lambda: task.inner_optimizer(params, lambda: torch.optim.AdamW(params)))
    assert "task.inner_optimizer returned dict, expected a torch.optim.Optimizer" in str(err), str(err)
    assert err.method == "inner_optimizer"


def test_inner_optimizer_is_the_tasks_own_or_the_default() -> None:
    params = list(torch.nn.Linear(2, 2).parameters())
    default = torch.optim.AdamW(params)
    assert _checked(Good()).inner_optimizer(params, lambda: default) is default
    own = _checked(OptimizerSGD()).inner_optimizer(params, lambda: default)
    assert isinstance(own, torch.optim.SGD)


def test_model_returning_a_non_module_is_refused() -> None:
    err = _error(lambda: _checked(ModelString()).model(0))
    assert "task.model returned str, expected a torch.nn.Module" in str(err), str(err)
    assert err.method == "model"


def test_model_without_trainable_parameters_is_refused() -> None:
    err = _error(lambda: _checked(ModelFrozen()).model(0))
    assert "no trainable parameters" in str(err), str(err)


def test_model_is_deterministic_per_seed_and_keeps_the_global_rng() -> None:
    task = _checked(Good())
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    a, b, c = task.model(7), task.model(7), task.model(8)
    assert torch.equal(torch.random.get_rng_state(), before), "task.model(seed) moved the caller's RNG"
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb), "the same seed built different parameters"
    assert not torch.equal(a.weight, c.weight), "different seeds built the same parameters"
    torch.manual_seed(7)
    assert torch.equal(a.weight, torch.nn.Linear(4, 2).weight), "model(seed) should seed torch with `seed`"


def test_model_that_raises_still_restores_the_rng() -> None:
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    err = _error(lambda: _checked(ModelRaises()).model(0))
    assert "task.model() raised RuntimeError: out of memory" in str(err), str(err)
    assert torch.equal(torch.random.get_rng_state(), before), "a failing task.model moved the caller's RNG"


# ----------------------------------------------------------------------------- preflight
def test_preflight_on_a_good_task_reports_what_it_saw() -> None:
    out = preflight(_checked(MetricsGood()), seed=3, shards=2)
    assert out == {"parameters": 4 * 2 + 2, "tokens_per_batch": 3, "eval_batches": 1,
                   "metrics": ["accuracy", "count"]}


@pytest.mark.parametrize("broken,method", [
    (LossShape(), "loss"), (LossFloat(), "loss"), (LossInt(), "loss"), (LossRaises(), "loss"),
    (LossNaN(), "loss"), (EvalNaN(), "loss"), (BatchesEmpty(), "batches"),
    (BatchesString(), "batches"), (BatchesNotIterable(), "batches"), (TokensZero(), "tokens"),
    (TokensFloat(), "tokens"), (EvalEmpty(), "eval_batches"), (MetricsList(), "metrics"),
    (MetricsBadValue(), "metrics"), (ModelString(), "model"), (ModelFrozen(), "model"),
    (ModelRaises(), "model"),
], ids=lambda v: type(v).__name__ if isinstance(v, Good) else str(v))
def test_preflight_refuses_each_broken_task(broken: Good, method: str) -> None:
    err = _error(lambda: preflight(_checked(broken, "broken.py:task"), seed=0))
    assert str(err).startswith("task broken.py:task: "), str(err)
    assert err.method == method, (err.method, str(err))


def test_preflight_on_the_example_digits_task() -> None:
    pytest.importorskip("sklearn")
    root = Path(__file__).resolve().parents[2]
    out = preflight(load_task(f"{root / 'examples/tasks/digits.py'}:task"), seed=0, shards=3)
    assert out["tokens_per_batch"] == 32
    assert out["parameters"] == 64 * 128 + 128 + 128 * 10 + 10
    assert out["metrics"] == ["accuracy"]


# ----------------------------------------------------------------------------- built-in gpt task
GPT_CFG = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)


@pytest.fixture(scope="module")
def gpt() -> CheckedTask:
    return load_task("gpt", {"data": "markov", "model": GPT_CFG, "batch_size": 4})


def test_gpt_batches_and_tokens(gpt: CheckedTask) -> None:
    it = gpt.batches(0, 2, 0)
    x, y = next(it)
    assert x.shape == (4, 16) and y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets should be the inputs shifted by one"
    assert gpt.tokens((x, y)) == 64


def test_gpt_shards_differ(gpt: CheckedTask) -> None:
    assert not torch.equal(next(gpt.batches(0, 2, 0))[0], next(gpt.batches(1, 2, 0))[0])


def test_gpt_eval_batches_and_loss(gpt: CheckedTask) -> None:
    held_out = gpt.eval_batches()
    assert held_out, "the built-in task has no held-out batch"
    model = gpt.model(0)
    loss = gpt.loss(model, held_out[0])
    assert loss.dim() == 0 and 0 < float(loss.detach()) < 10
    assert gpt.describe()["data"].startswith("markov")


def test_gpt_model_matches_build_model(gpt: CheckedTask) -> None:
    ours, reference = gpt.model(5).state_dict(), build_model(GPT_CFG, 5).state_dict()
    assert ours.keys() == reference.keys()
    for name in ours:
        assert torch.equal(ours[name], reference[name]), f"{name} differs from build_model(cfg, 5)"


def test_gpt_preflight(gpt: CheckedTask) -> None:
    out = preflight(gpt, seed=0, shards=2)
    assert out["tokens_per_batch"] == 64
    assert out["parameters"] == sum(p.numel() for p in build_model(GPT_CFG, 0).parameters())


def test_unknown_builtin_is_a_spec_error() -> None:
    err = _load_error("gpt2")
    assert str(err).startswith("--task gpt2: expected FILE.py:NAME"), str(err)


# ----------------------------------------------------------------------------- reporting
def test_report_task_error_prints_message_then_traceback_and_emits_an_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = EventLog(tmp_path, "learner-2", learner=2)
    report_task_error(TaskError("task t: task.loss returned nan at step 9", "t", "loss", "Traceback: here\n"),
                      log, position=41)
    log.close()
    err = capsys.readouterr().err
    assert err.startswith("error: task t: task.loss returned nan at step 9\n"), err
    assert "Traceback: here" in err
    (event,) = [e for e in read_events(tmp_path) if e["kind"] == "task_error"]
    assert (event["learner"], event["task"], event["method"], event["position"]) == (2, "t", "loss", 41)
    assert event["error"] == "task t: task.loss returned nan at step 9"


def test_task_failures_collects_every_task_error_in_order() -> None:
    events = [{"kind": "inner_step", "learner": 1},
              {"kind": "task_error", "learner": 2, "method": "loss", "error": "a"},
              {"kind": "task_error", "learner": 1, "method": "batches", "error": "b"}]
    assert task_failures(events) == {"task_errors": [{"learner": 2, "method": "loss", "error": "a"},
                                                     {"learner": 1, "method": "batches", "error": "b"}]}
    assert task_failures(events[:1]) == {}


# ----------------------------------------------------------------------------- device
@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_check_device_accepts(spec: str) -> None:
    assert check_device(spec) == spec


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:x", "cpu:0", "", "mps"])
def test_check_device_rejects_naming_the_flag(spec: str) -> None:
    with pytest.raises(ValueError, match=r"^--device: must be auto, cpu, cuda or cuda:N") as info:
        check_device(spec)
    assert repr(spec) in str(info.value)


def test_resolve_device_cpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu", rank=3) == torch.device("cpu")


def test_resolve_device_auto() -> None:
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_resolve_device_cuda_without_cuda(spec: str) -> None:
    with pytest.raises(ValueError, match=rf"^--device {spec}: this machine has no CUDA device"):
        resolve_device(spec)


def test_resolve_device_rejects_a_bad_spec() -> None:
    with pytest.raises(ValueError, match="--device"):
        resolve_device("gpu")


# ----------------------------------------------------------------------------- RunSpec
FULL = RunSpec(learners=3, ranks=2, task="/abs/tasks/digits.py:task", device="cpu", data="markov:order=2",
               trainer_args=["--sync-every", "5", "--seed", "3"],
               learner_args={2: ["--speed", "0.5"], 3: ["--ranks", "1"]}, duration=12.5, warm_spares=1,
               seed=9, env={"OMP_NUM_THREADS": "1"})


def test_runspec_json_round_trip() -> None:
    text = json.dumps(FULL.to_json())
    back = RunSpec.from_json(json.loads(text))
    assert back == FULL
    assert back.learner_args == {2: ("--speed", "0.5"), 3: ("--ranks", "1")}
    assert back.trainer_args == ("--sync-every", "5", "--seed", "3")


def test_runspec_from_json_fills_defaults() -> None:
    assert RunSpec.from_json({}) == RunSpec()
    assert RunSpec.from_json({"learners": 2, "unknown": 1, "duration": 4}) == RunSpec(learners=2, duration=4.0)


@pytest.mark.parametrize("data,field", [
    ({"learners": "x"}, "learners"),
    ({"learners": 0}, "learners"),
    ({"trainer_args": [1]}, "trainer_args"),
    ({"trainer_args": "--seed 1"}, "trainer_args"),
    ({"learner_args": {"a": []}}, "learner_args"),
    ({"learner_args": {"1": "--speed"}}, "learner_args"),
    ({"learners": 2, "learner_args": {"3": []}}, "learner_args"),
    ({"env": ["A=b"]}, "env"),
    ({"duration": "10"}, "duration"),
    ({"device": "gpu"}, "--device"),
    ({"task": 5}, "task"),
    ({"mode": "async"}, "mode"),
])
def test_runspec_from_json_errors_name_file_and_field(data: dict, field: str) -> None:
    with pytest.raises(ValueError) as info:
        RunSpec.from_json(data, source="runs/x/run.json")
    assert str(info.value).startswith(f"runs/x/run.json: {field}"), str(info.value)


def test_runspec_from_json_refuses_a_non_object() -> None:
    with pytest.raises(ValueError, match=r"^run.json: expected a JSON object, got list"):
        RunSpec.from_json([1])


def test_to_argv_names_the_task_only_when_not_default() -> None:
    argv = RunSpec(task="my.py:task").to_argv()
    assert argv[argv.index("--task") + 1] == "my.py:task"
    assert "--task" not in RunSpec().to_argv()
    argv = FULL.to_argv("sched.yaml")
    assert argv[:5] == ["python", "-m", "chaos", "run", "sched.yaml"]
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--duration") + 1] == "12.5"
    assert argv[argv.index("--") + 1:] == ["--sync-every", "5", "--seed", "3"]


def test_process_flags_carry_task_and_device() -> None:
    syncer = FULL.syncer_flags()
    assert syncer[syncer.index("--task") + 1] == FULL.task
    assert syncer[syncer.index("--learners") + 1] == "3"
    assert syncer[-4:] == ["--sync-every", "5", "--seed", "3"]
    for i in (1, 2, 3):
        flags = FULL.learner_flags(i)
        assert flags[flags.index("--task") + 1] == FULL.task
        assert flags[flags.index("--device") + 1] == "cpu"
        assert flags[flags.index("--data") + 1] == "markov:order=2"
    assert FULL.learner_flags(2)[-2:] == ["--speed", "0.5"]
    assert "--ranks" not in RunSpec().learner_flags(1)


def test_ranks_of() -> None:
    assert FULL.ranks_of(1) == 2
    assert FULL.ranks_of(3) == 1
    spec = RunSpec(learners=2, learner_args={1: ["--ranks", "2", "--ranks=4"], 2: ["--ranks"]})
    assert spec.ranks_of(1) == 4, "the last --ranks wins"
    assert spec.ranks_of(2) == 1, "a dangling --ranks is ignored"


def test_with_learner_flags_puts_common_flags_first() -> None:
    spec = RunSpec(learners=3, learner_args={2: ["--speed", "0.5"]}).with_learner_flags(["--threads", "1"])
    assert spec.learner_args == {1: ("--threads", "1"), 2: ("--threads", "1", "--speed", "0.5"),
                                 3: ("--threads", "1")}
    assert spec.learner_flags(2)[-4:] == ["--threads", "1", "--speed", "0.5"]


def test_runspec_is_immutable() -> None:
    spec = RunSpec(trainer_args=["--seed", "1"])
    assert isinstance(spec.trainer_args, tuple)
    with pytest.raises(AttributeError):
        spec.learners = 5  # type: ignore[misc]


# ----------------------------------------------------------------------------- restart backoff
def test_restart_backoff_doubles_and_caps() -> None:
    assert launch.restart_backoff(1.0, 0) == 1.0
    assert [launch.restart_backoff(1.0, k) for k in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert launch.restart_backoff(1.0, 6) == launch.MAX_RESTART_DELAY
    assert launch.restart_backoff(1.0, 60) == launch.MAX_RESTART_DELAY, "2**59 should still be capped"
    assert launch.restart_backoff(0.5, 3) == 2.0


class _FakePopen:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_supervise_backs_off_a_learner_that_keeps_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each short life doubles the next delay; a FATAL_EXIT learner is never restarted."""
    clock = [100.0]
    monkeypatch.setattr(launch, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cluster = launch.LocalCluster(launch.ClusterSpec(tmp_path, RunSpec(learners=2)))
    cluster.syncer.popen = _FakePopen(None)  # alive
    starts: list[tuple[str, float]] = []

    def spawn(proc: launch.Proc, env: dict[str, str] | None = None) -> None:  # as LocalCluster._spawn, with a process that exits at once
        starts.append((proc.name, clock[0]))
        proc.popen = _FakePopen(TASK_EXIT if proc.name == "learner-1" else launch.FATAL_EXIT)  # type: ignore[assignment]
        proc.died_at, proc.started_at = None, clock[0]

    monkeypatch.setattr(cluster, "_spawn", spawn)
    for i in (1, 2):
        cluster.start_learner(i)
    assert "--task" in cluster.learners[1].argv
    starts.clear()
    for _ in range(200):  # 20 s in steps of 0.1 s
        clock[0] += 0.1
        cluster.supervise(restart_delay=1.0)
    cluster.events.close()
    assert all(name == "learner-1" for name, _ in starts), f"a learner that exited {launch.FATAL_EXIT} was restarted: {starts}"
    restarts = [e for e in read_events(tmp_path) if e["kind"] == "restart"]
    assert [e["target"] for e in restarts] == ["learner-1"] * len(restarts)
    assert all(e["exit_code"] == TASK_EXIT for e in restarts)
    delays = [e["delay"] for e in restarts]
    assert len(delays) >= 3, f"expected at least 3 restarts in 20 s, got {delays}"
    for k, delay in enumerate(delays, start=1):
        assert delay >= launch.restart_backoff(1.0, k) - 0.01, f"restart {k} came after {delay} s: {delays}"
        assert delay < launch.restart_backoff(1.0, k) + 0.15, f"restart {k} came after {delay} s: {delays}"


def test_move_batch_keeps_a_namedtuple_and_a_mapping_type() -> None:
    import collections

    from trainer.task import move_batch
    pair = collections.namedtuple("Pair", "x y")
    moved = move_batch(pair(torch.ones(2), torch.zeros(2)), torch.device("cpu"))
    assert type(moved) is pair and torch.equal(moved.x, torch.ones(2)), "a task reading batch.x must still work"
    ordered = move_batch(collections.OrderedDict(a=torch.ones(1)), torch.device("cpu"))
    assert type(ordered) is collections.OrderedDict


def test_describe_may_not_take_a_key_islands_reports_itself() -> None:
    from trainer.task import CheckedTask

    class Facts:
        def describe(self):
            return {"final_loss": 0.1}

    with pytest.raises(TaskError, match="task.describe returned the key 'final_loss'"):
        CheckedTask(Facts(), "x.py:task").describe()


def test_a_task_whose_batches_take_start_seeks_instead_of_being_read_and_dropped() -> None:
    from trainer.task import CheckedTask

    class Seeking:
        calls: list[int] = []

        def batches(self, shard, shards, seed, start=0):
            self.calls.append(start)
            i = start
            while True:
                yield torch.full((1,), float(i))
                i += 1

    task = Seeking()
    first = next(CheckedTask(task, "s.py:task").batches(0, 1, 0, skip=1000))
    assert task.calls == [1000] and float(first) == 1000.0, "resumed at batch 1000 without making 1000 batches"
    assert float(next(CheckedTask(task, "s.py:task").batches(0, 1, 0))) == 0.0 and task.calls[-1] == 0
