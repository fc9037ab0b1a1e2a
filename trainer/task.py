"""Bring your own model and data: the Task contract, its loader, and the checks around it.

A task is a module attribute named `--task path/to/file.py:NAME` or `--task pkg.module:NAME`:
an object with the methods of `Task` below, or a zero-argument callable (a class, a
function) returning one. Learners train it; the syncer builds its model only to hold the
global parameters Θ and to score them on `eval_batches`.

Every call into the user's code goes through `CheckedTask`, which turns a wrong type, a
non-scalar or non-finite loss, an exhausted iterator or an exception into a `TaskError`
whose message names the task and the method: a user reads *what* went wrong, *where*,
before any traceback.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, Union, runtime_checkable

import torch

Batch = Union[torch.Tensor, tuple, list, dict]
REQUIRED = ("model", "batches", "loss", "tokens", "eval_batches")
BUILTIN_TASKS = ("gpt",)
MAX_EVAL_BATCHES = 10_000
# Keys of the events and summaries that describe()'s facts are written beside.
RESERVED_FACTS = frozenset({"final_loss", "metrics", "kind", "t", "wall", "process", "pid", "learner", "task",
                            "mode", "learners"})


@runtime_checkable
class Task(Protocol):
    """What Islands needs from a user's training job. Keep these names: task files are written against them."""

    def model(self) -> torch.nn.Module:
        """The model. Islands seeds torch (the run's --seed) first, so every process builds the same Θ₀."""

    def batches(self, shard: int, shards: int, seed: int) -> Iterator[Batch]:
        """An endless iterator over shard `shard` (0-based) of `shards` of the training data.
        It may take a keyword `start` (batches already consumed, to skip): a restarted
        learner then resumes at once; otherwise Islands reads and drops that many."""

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """A scalar to minimise."""

    def tokens(self, batch: Batch) -> int:
        """The batch's weight in merges and goodput: tokens for a language model, samples otherwise."""

    def eval_batches(self) -> Iterable[Batch]:
        """A fixed held-out set: the final loss and the final_loss check use it."""


class TaskError(Exception):
    """A task that cannot be loaded or that failed a call; the message names task and method."""

    def __init__(self, message: str, task: str = "", method: str = "", details: str = "") -> None:
        super().__init__(message)
        self.task = task
        self.method = method
        self.details = details  # the user's traceback, for the log


def _user_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# ----------------------------------------------------------------------------- loading
def split_spec(spec: str) -> tuple[str, str]:
    """`file.py:NAME` or `pkg.mod:NAME` → (where, NAME); the error names the flag."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name or not name.isidentifier():
        raise TaskError(f"--task {spec}: expected FILE.py:NAME or MODULE:NAME (or a built-in task: "
                        f"{', '.join(BUILTIN_TASKS)})", spec)
    return where, name


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise TaskError(f"--task {spec}: no such file: {path}", spec)
    module_name = f"islands_task_{abs(hash(str(path.resolve())))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise TaskError(f"--task {spec}: cannot import {path}", spec)
    module = importlib.util.module_from_spec(loader_spec)
    folder = str(path.resolve().parent)  # a task may import its neighbours (last: they shadow nothing)
    if folder not in sys.path:
        sys.path.append(folder)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise TaskError(f"--task {spec}: importing {path} raised {type(exc).__name__}: {exc}", spec,
                        "import", _user_traceback(exc)) from exc
    return module


def _import_module(name: str, spec: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise TaskError(f"--task {spec}: no module named {exc.name!r}", spec) from None
        raise TaskError(f"--task {spec}: importing {name} raised ModuleNotFoundError: {exc}", spec, "import",
                        _user_traceback(exc)) from exc
    except Exception as exc:
        raise TaskError(f"--task {spec}: importing {name} raised {type(exc).__name__}: {exc}", spec, "import",
                        _user_traceback(exc)) from exc


def resolve_spec(spec: str) -> str:
    """The spec with a task file's path made absolute: every process of a run (and a replay
    from another directory) then loads the same file."""
    if spec in BUILTIN_TASKS:
        return spec
    where, name = split_spec(spec)
    if where.endswith(".py") or "/" in where:
        return f"{Path(where).resolve()}:{name}"
    return spec


def load_task(spec: str, builtin_options: dict | None = None) -> "CheckedTask":
    """The task named by `spec`, checked. Built-in tasks take `builtin_options` (the run's
    model flags and data); a user's task is constructed from its file alone."""
    if spec in BUILTIN_TASKS:
        from .tasks import builtin
        return CheckedTask(builtin(spec, builtin_options or {}), spec)
    where, name = split_spec(spec)
    module = _import_file(Path(where), spec) if where.endswith(".py") or "/" in where else _import_module(where, spec)
    if not hasattr(module, name):
        raise TaskError(f"--task {spec}: no attribute {name!r}", spec)
    obj = getattr(module, name)
    if inspect.isclass(obj) or (callable(obj) and not _has_methods(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise TaskError(f"--task {spec}: calling {name}() raised {type(exc).__name__}: {exc}", spec,
                            name, _user_traceback(exc)) from exc
    missing = [m for m in REQUIRED if not callable(getattr(obj, m, None))]
    if missing:
        raise TaskError(f"--task {spec}: {type(obj).__name__} has no method {missing[0]!r} "
                        f"(a task needs {', '.join(REQUIRED)})", spec, missing[0])
    return CheckedTask(obj, spec)


def _takes_start(fn: Callable) -> bool:
    """Whether `batches` takes the optional `start` (batches to skip) keyword."""
    try:
        return "start" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _has_methods(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in REQUIRED)


# ----------------------------------------------------------------------------- checks
def check_batch(batch: Any, where: str) -> None:
    """A batch is a tensor, or a tuple, list or dict of them (nested)."""
    if isinstance(batch, torch.Tensor):
        return
    if isinstance(batch, (tuple, list)) and batch:
        for item in batch:
            check_batch(item, where)
        return
    if isinstance(batch, dict) and batch:
        for item in batch.values():
            check_batch(item, where)
        return
    raise TypeError(f"{where} yielded {type(batch).__name__}, expected a tensor or a tuple, list or dict of tensors")


def move_batch(batch: Batch, device: torch.device) -> Batch:
    """The batch on `device`, same structure."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple):
        items = [move_batch(b, device) for b in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)  # a namedtuple stays one
    if isinstance(batch, list):
        return [move_batch(b, device) for b in batch]
    return type(batch)((k, move_batch(v, device)) for k, v in batch.items())


class CheckedTask:
    """A task whose every call is checked; failures raise TaskError naming task and method."""

    def __init__(self, task: Any, spec: str) -> None:
        self.task = task
        self.spec = spec

    def _fail(self, method: str, what: str, exc: BaseException | None = None) -> TaskError:
        details = _user_traceback(exc) if exc is not None else ""
        return TaskError(f"task {self.spec}: {what}", self.spec, method, details)

    def _call(self, method: str, label: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except TaskError:
            raise
        except Exception as exc:
            raise self._fail(method, f"task.{label} raised {type(exc).__name__}: {exc}", exc) from exc

    def model(self, seed: int) -> torch.nn.Module:
        """task.model() under torch.manual_seed(seed), the caller's RNG state kept."""
        state = torch.random.get_rng_state()
        # The CPU generator, and CUDA's only where there is one: torch.manual_seed would
        # queue a lazy CUDA seeding with a stack trace every call, on machines with no GPU.
        torch.random.default_generator.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        try:
            model = self._call("model", "model()", self.task.model)
        finally:
            torch.random.set_rng_state(state)
        if not isinstance(model, torch.nn.Module):
            raise self._fail("model", f"task.model returned {type(model).__name__}, expected a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise self._fail("model", "task.model returned a module with no trainable parameters")
        return model

    def batches(self, shard: int, shards: int, seed: int, skip: int = 0) -> Iterator[Batch]:
        """The shard's batches, checked one by one; `skip` fast-forwards past the batches a
        previous incarnation consumed, so a restarted learner resumes its data."""
        label = f"batches(shard={shard})"
        if skip and _takes_start(self.task.batches):  # the task seeks: no batch is made only to be dropped
            it = self._call("batches", label, lambda: iter(self.task.batches(shard, shards, seed, start=skip)))
            return self._checked_batches(it, label, 0)
        it = self._call("batches", label, lambda: iter(self.task.batches(shard, shards, seed)))
        return self._checked_batches(it, label, skip)

    def _checked_batches(self, it: Iterator[Any], label: str, skip: int) -> Iterator[Batch]:
        n = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                raise self._fail("batches", f"task.{label} ended after {n} batches; it must be endless "
                                            f"(e.g. wrap an epoch in `while True`)") from None
            except Exception as exc:
                raise self._fail("batches", f"task.{label} raised {type(exc).__name__}: {exc}", exc) from exc
            try:
                check_batch(batch, f"task.{label}")
            except TypeError as exc:
                raise self._fail("batches", str(exc)) from None
            n += 1
            if n > skip:
                yield batch

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        out = self._call("loss", "loss", lambda: self.task.loss(model, batch))
        if not isinstance(out, torch.Tensor):
            raise self._fail("loss", f"task.loss returned {type(out).__name__}, expected a scalar tensor")
        if out.dim() != 0:
            raise self._fail("loss", f"task.loss returned a tensor of shape {tuple(out.shape)}, expected a scalar")
        if not out.is_floating_point():
            raise self._fail("loss", f"task.loss returned a {out.dtype} tensor, expected a floating-point scalar")
        return out

    def check_finite(self, value: float, step: int) -> None:
        if not math.isfinite(value):
            raise self._fail("loss", f"task.loss returned {value} at step {step}")

    def tokens(self, batch: Batch) -> int:
        out = self._call("tokens", "tokens", lambda: self.task.tokens(batch))
        if isinstance(out, torch.Tensor) and out.numel() == 1 and not out.is_floating_point():
            out = int(out)
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise self._fail("tokens", f"task.tokens returned {out!r}, expected an integer >= 1")
        return out

    def eval_batches(self) -> list[Batch]:
        """The held-out set, listed once (it must be the same every time)."""
        it = self._call("eval_batches", "eval_batches()", lambda: iter(self.task.eval_batches()))
        out = []
        for _ in range(MAX_EVAL_BATCHES):
            try:
                batch = next(it)
            except StopIteration:
                break
            except Exception as exc:
                raise self._fail("eval_batches", f"task.eval_batches() raised {type(exc).__name__}: {exc}",
                                 exc) from exc
            try:
                check_batch(batch, "task.eval_batches()")
            except TypeError as exc:
                raise self._fail("eval_batches", str(exc)) from None
            out.append(batch)
        else:
            raise self._fail("eval_batches", f"task.eval_batches() yielded more than {MAX_EVAL_BATCHES} "
                                             f"batches; it must be a finite held-out set")
        if not out:
            raise self._fail("eval_batches", "task.eval_batches() yielded no batch")
        return out

    def inner_optimizer(self, params: list[torch.nn.Parameter], default: Callable[[], torch.optim.Optimizer]
                        ) -> torch.optim.Optimizer:
        """The task's own inner optimizer when it has one, else `default()` (AdamW with --inner-lr)."""
        if not self.has_inner_optimizer:
            return default()
        opt = self._call("inner_optimizer", "inner_optimizer", lambda: self.task.inner_optimizer(params))
        if not isinstance(opt, torch.optim.Optimizer):
            raise self._fail("inner_optimizer",
                             f"task.inner_optimizer returned {type(opt).__name__}, expected a torch.optim.Optimizer")
        return opt

    def describe(self) -> dict:
        """Facts about the data reported beside the loss (e.g. a known loss floor); optional."""
        make = getattr(self.task, "describe", None)
        if make is None:
            return {"data": self.spec}
        out = self._call("describe", "describe()", make)
        if not isinstance(out, dict):
            raise self._fail("describe", f"task.describe returned {type(out).__name__}, expected a dict")
        taken = sorted(set(out) & RESERVED_FACTS)
        if taken:
            raise self._fail("describe", f"task.describe returned the key {taken[0]!r}, which Islands reports "
                                         f"itself; name it otherwise")
        return out

    @property
    def has_inner_optimizer(self) -> bool:
        return callable(getattr(self.task, "inner_optimizer", None))

    @property
    def has_metrics(self) -> bool:
        return callable(getattr(self.task, "metrics", None))

    def metrics(self, model: torch.nn.Module, batch: Batch) -> dict[str, float]:
        if not self.has_metrics:
            return {}
        out = self._call("metrics", "metrics", lambda: self.task.metrics(model, batch))
        if not isinstance(out, dict):
            raise self._fail("metrics", f"task.metrics returned {type(out).__name__}, expected a dict of floats")
        result = {}
        for key, value in out.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = float(value)
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail("metrics", f"task.metrics returned {key!r}: {value!r}, expected str: float")
            result[key] = float(value)
        return result


def preflight(task: CheckedTask, seed: int, shards: int = 1) -> dict:
    """Call every method once, as a run would, before starting anything: a broken task
    fails here with its clear error instead of in a learner's log. Returns what it saw."""
    model = task.model(seed)
    batch = next(task.batches(0, shards, seed))
    loss = task.loss(model, batch)
    task.check_finite(float(loss.detach()), 0)
    loss.backward()
    tokens = task.tokens(batch)
    held_out = task.eval_batches()
    with torch.no_grad():
        model.eval()
        task.check_finite(float(task.loss(model, held_out[0])), 0)
        metrics = task.metrics(model, held_out[0])
    return {"parameters": sum(p.numel() for p in model.parameters()), "tokens_per_batch": tokens,
            "eval_batches": len(held_out), "metrics": sorted(metrics)}


def check_run_task(train: Any, data: Any, shards: int) -> dict:
    """The run's task (`train`: its TrainConfig) loaded and preflighted with `shards`
    shards, as every process of the run will load it; returns what it says of its data.
    Raises TaskError (the task) or ValueError/FileNotFoundError (the built-in task's data)."""
    task = load_task(train.task, train.task_options(data))
    preflight(task, train.seed, shards)
    return task.describe()
