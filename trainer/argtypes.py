"""argparse value types shared by every CLI; no heavy imports, so the pytest plugin can use them."""
from __future__ import annotations

import argparse
import re


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def on_off(text: str) -> bool:
    """on/off (also true/false, yes/no, 1/0): a switch that `forward_flags` can hand on as text."""
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def rounds_or_auto(text: str) -> float | str:
    """A number of rounds >= 0, or `auto`."""
    if text == "auto":
        return text
    try:
        return non_negative_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number of rounds >= 0 or 'auto', got {text!r}") from None


_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def check_device(spec: str) -> str:
    """`auto|cpu|cuda|cuda:N` (trainer/device.py resolves it), or a ValueError naming --device."""
    if not isinstance(spec, str) or not _DEVICE.match(spec):
        raise ValueError(f"--device: must be auto, cpu, cuda or cuda:N, got {spec!r}")
    return spec


def device_arg(value: str) -> str:
    try:
        return check_device(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--device: ")) from None
