"""Import a script under bench/ (not a package) so its pure parts can be unit-tested."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(relative: str, name: str) -> ModuleType:
    """bench/<relative> as module `name`, registered in sys.modules (dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
