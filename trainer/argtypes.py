"""argparse value types shared by every CLI; no heavy imports, so the pytest plugin can use them."""
from __future__ import annotations

import argparse
import difflib
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


# --------------------------------------------------------------------------- the parser every CLI uses


class DefaultsFormatter(argparse.HelpFormatter):
    """Shows every option's default after its help, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text == argparse.SUPPRESS or not action.option_strings or "default" in text.lower():
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
            return f"{text} (default: off, the flag not given)"
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        if action.default is None:
            return f"{text} (default: none)"
        if isinstance(action.default, (list, tuple)) and not action.default:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


class DescriptionFormatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """DefaultsFormatter that keeps a description's own line breaks (a script's docstring)."""


class Parser(argparse.ArgumentParser):
    """argparse, as every Islands command line uses it.

    - Every flag has help text: a flag added without one is refused when the parser is
      built, so none can be added undocumented; the help shows each default (DefaultsFormatter).
    - Errors are short: one line of usage (`--help` for the rest), the error, and for an
      unknown flag the nearest known ones ("did you mean --learners?").
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        _require_help(action, self.prog)
        return action

    def add_argument_group(self, *args, **kwargs):
        return self._checked(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, *args, **kwargs):
        return self._checked(super().add_mutually_exclusive_group(*args, **kwargs))

    def _checked(self, group):
        """`group`, whose flags are refused without help text as the parser's own are."""
        original = group.add_argument

        def add_argument(*a, **k):
            action = original(*a, **k)
            _require_help(action, self.prog)
            return action

        group.add_argument = add_argument  # type: ignore[method-assign]
        return group

    def error(self, message: str):  # type: ignore[override]
        """`prog: error: message`, with the nearest known flags for an unknown one, and a
        pointer to --help instead of the whole usage (which buried the one line that matters)."""
        hint = self._suggest(message)
        self.exit(2, f"{self.prog}: error: {message}{hint}\nusage: `{self.prog} --help` lists every flag\n")

    def _suggest(self, message: str) -> str:
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hints = []
        for word in message[len(prefix):].split():
            flag = word.split("=", 1)[0]
            if not flag.startswith("-"):
                continue
            close = difflib.get_close_matches(flag, known, n=2, cutoff=0.6)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
        return ("\n" + "\n".join(hints)) if hints else ""


def _require_help(action: argparse.Action, prog: str) -> None:
    if not action.help and not isinstance(action, argparse._SubParsersAction):
        name = "/".join(action.option_strings) or action.dest
        raise ValueError(f"{prog}: {name} has no help text: every flag says what it does (trainer/argtypes.py)")


def parse_with_hints(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv` with subcommands, reporting an unknown flag from the subcommand it was
    given to, so the suggestion and the usage are that subcommand's, not the top level's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = subcommand_parser(parser, args)
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser | None:
    """The subparser `args` was parsed by (None without subcommands)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            return action.choices.get(chosen) if chosen is not None else None
    return None
