"""Built-in tasks, written against the same contract as a user's (trainer/task.py)."""
from __future__ import annotations

from typing import Any


def builtin(name: str, options: dict) -> Any:
    """The built-in task `name`, configured by the run's flags (`options`)."""
    if name == "gpt":
        from .gpt import GPTTask
        return GPTTask.from_options(options)
    raise ValueError(f"--task: unknown built-in task {name!r}")
