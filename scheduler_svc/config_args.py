"""``SchedulerConfig`` on a command line: one option per field, taken from the dataclass.

Every command that configures a scheduler (``python -m scheduler_svc``, ``fastserve serve``,
``fastserve sim``) calls ``add_config_args``, so a new field of ``SchedulerConfig`` is an
option of all of them with no other edit. A field ``max_batch_size`` is ``--max-batch-size``;
a trailing ``_s`` (seconds) is dropped from the option (``starve_limit_s`` is
``--starve-limit``; ``--starve-limit-s`` works too). The option's type, default and help are the
field's: ``int``, ``float``, ``str``, ``bool`` (``--x`` / ``--no-x``) and any of them ``| None``
(the value ``none`` unsets it); its choices are the field's ``choices`` metadata, and the
registered policies for ``policy``. The parsed value lands under the field's own name.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from scheduler_svc.core.config import SchedulerConfig

FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(SchedulerConfig)
DEFAULTS = SchedulerConfig()


def policy_names() -> list[str]:
    """The registered scheduling policies (importing the registry registers them all)."""
    from scheduler_svc.core.policies import POLICIES

    return sorted(POLICIES)


# Choices that come from somewhere other than the field's metadata (a registry).
_CHOICES: dict[str, Callable[[], Sequence[str]]] = {"policy": policy_names}


def option_names(f: dataclasses.Field) -> list[str]:
    """``--name`` options of field ``f``: the short form first, then the field's full name."""
    full = "--" + f.name.replace("_", "-")
    if f.name.endswith("_s"):
        return [full.removesuffix("-s"), full]
    return [full]


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(SchedulerConfig)


def field_type(name: str) -> tuple[type, bool]:
    """The type of field ``name`` and whether it may be None (``T | None``)."""
    hint = _hints()[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1 or len(args) == len(typing.get_args(hint)):
            raise TypeError(f"SchedulerConfig.{name}: only `T | None` unions are supported, "
                            f"got {hint}")
        return args[0], True
    return hint, False


def parse_value(name: str, text: str) -> Any:
    """``text`` as a value of field ``name``; raises ``ValueError`` with a readable message."""
    kind, optional = field_type(name)
    if optional and text.strip().lower() in ("", "none"):
        return None
    if kind is bool:
        low = text.strip().lower()
        if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"{name}: expected true or false, got {text!r}")
        return low in ("1", "true", "yes", "on")
    if kind not in (int, float, str):
        raise TypeError(f"SchedulerConfig.{name}: no command-line form for {kind}")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name}: expected {kind.__name__}, got {text!r}") from None


def _argtype(name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse_value(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    kind, optional = field_type(name)
    convert.__name__ = f"{kind.__name__}{' or none' if optional else ''}"  # argparse's errors
    return convert


def choices(f: dataclasses.Field) -> Sequence[str] | None:
    """The values field ``f`` may take, when they are a fixed set."""
    if f.name in _CHOICES:
        return _CHOICES[f.name]()
    return f.metadata.get("choices")


def add_config_args(parser: argparse.ArgumentParser, *, defaults: bool = True,
                    title: str = "scheduler settings",
                    overrides: dict[str, Any] | None = None) -> argparse._ArgumentGroup:
    """Add an option for every ``SchedulerConfig`` field to ``parser``, in a group of its own.

    With ``defaults=False`` an option that is not given is None in the namespace (for a
    command that passes only the given settings on, or merges them with others); the help
    still shows the scheduler's default. ``overrides`` gives this command defaults of its own
    for some fields (used, and shown, even with ``defaults=False``).
    """
    overrides = overrides or {}
    group = parser.add_argument_group(title, "every SchedulerConfig field "
                                      "(scheduler_svc/core/config.py)")
    for f in FIELDS:
        help_text = f.metadata.get("help")
        if not help_text:
            raise TypeError(f"SchedulerConfig.{f.name} has no help: declare it with setting()")
        default = overrides.get(f.name, getattr(DEFAULTS, f.name))
        shown = "none" if default is None else default
        kw: dict[str, Any] = {
            "dest": f.name,
            "default": default if defaults or f.name in overrides else None,
            "help": f"{help_text} (default: {shown})".replace("%", "%%"),
        }
        kind, _ = field_type(f.name)
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = _argtype(f.name)
            kw["metavar"] = f.name.removesuffix("_s").upper()
            values = choices(f)
            if values is not None:
                kw["choices"] = list(values)
                del kw["metavar"]  # argparse shows the choices
        group.add_argument(*option_names(f), **kw)
    return group


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """The settings ``ns`` holds: every field present in it and not None, by field name."""
    return {f.name: v for f in FIELDS if (v := getattr(ns, f.name, None)) is not None}


def config_from_args(ns: argparse.Namespace, **overrides: Any) -> SchedulerConfig:
    """A validated ``SchedulerConfig`` from the parsed options (the defaults where not given),
    then ``overrides``; raises ``ValueError`` on a value the config refuses."""
    return SchedulerConfig(**{**given(ns), **overrides})


def config_argv(ns: argparse.Namespace) -> list[str]:
    """The options that give a scheduler process the settings ``ns`` holds (only those given,
    so that the process's own defaults apply to the rest)."""
    return list(_argv(given(ns)))


def _argv(settings: dict[str, Any]) -> Iterator[str]:
    for f in FIELDS:
        if f.name not in settings:
            continue
        value, option = settings[f.name], option_names(f)[0]
        if isinstance(value, bool):
            yield option if value else "--no-" + option.removeprefix("--")
        else:
            yield from (option, str(value))
