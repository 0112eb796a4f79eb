"""One description per option: the field of an options dataclass carries its help text and its
command-line flag, and the CLIs' typer options (``cli_option``), the Spark jobs' argparse
arguments (``add_option``) and the public functions' keywords are made from it or checked
against it (tests/test_option_sources.py), so that an option's name, default and help are said
once: the flag, the default and the help of ``train --io-concurrency`` are
``OpenOptions.io_concurrency``'s."""
from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Callable
from typing import Any

_HELP, _FLAG, _CLI_DEFAULT = "help", "flag", "cli_default"


def option(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None,
           factory: Callable[[], Any] | None = None, cli_default: str | None = None) -> Any:
    """A dataclass field that documents itself. ``help``: what the option does, in words that
    suit ``--help`` and a docstring alike; ``flag``: the command line's name when it is not the
    field's name with dashes; ``cli_default``: the default as the command line writes it, for an
    option the command line parses from text ("10GB")."""
    metadata = {_HELP: help, _FLAG: flag, _CLI_DEFAULT: cli_default}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def option_field(cls: type, name: str) -> dataclasses.Field[Any]:
    """The field ``name`` of the options class ``cls``; KeyError naming both when there is none."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no option {name!r}")


def help_of(cls: type, name: str) -> str:
    text = option_field(cls, name).metadata.get(_HELP)
    if not text:
        raise KeyError(f"{cls.__name__}.{name} has no help text: declare it with option(help=...)")
    return str(text)


def flag_of(cls: type, name: str) -> str:
    """``--name-with-dashes``, or the flag the field declares."""
    return "--" + str(option_field(cls, name).metadata.get(_FLAG) or name.replace("_", "-"))


def default_of(cls: type, name: str) -> Any:
    """The field's default (a fresh one for a field with a factory); MISSING for a required field."""
    f = option_field(cls, name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def cli_default_of(cls: type, name: str) -> Any:
    """The default as the command line writes it: the declared text form, else the default."""
    text = option_field(cls, name).metadata.get(_CLI_DEFAULT)
    return text if text is not None else default_of(cls, name)


def documented(cls: type) -> list[str]:
    """The names of ``cls``'s fields declared with ``option``, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get(_HELP)]


def in_flag_words(message: str, cls: type) -> str:
    """A message that names ``cls``'s fields (``batch_size=0 ...``, ``batch_size must ...``) with
    the command line's flags instead (``--batch-size``): what a command says of its options."""
    for f in sorted(dataclasses.fields(cls), key=lambda f: -len(f.name)):
        flag = flag_of(cls, f.name).split("/")[0]
        message = re.sub(rf"(?<![\w-]){f.name}[= ]", flag + " ", message)
    return message


#: ``cli_option``'s default: the field's own.
DECLARED: Any = object()


def cli_option(cls: type, name: str, *, default: Any = DECLARED, help_suffix: str = "", **typer_kwargs: Any) -> Any:
    """The typer option of field ``name`` of ``cls`` (a required field: a required option).
    ``default``: the command line's own, where it differs (None for an option that only counts
    with another); ``help_suffix``: what only the command line adds."""
    import typer  # the commands' library, imported by the commands only

    value = cli_default_of(cls, name) if default is DECLARED else default
    if value is dataclasses.MISSING:
        value = ...
    return typer.Option(value, flag_of(cls, name), help=help_of(cls, name) + help_suffix, **typer_kwargs)


def add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, name: str, *,
               help_suffix: str = "", **argparse_kwargs: Any) -> None:
    """The argparse argument of field ``name`` of ``cls`` (the Spark jobs' command lines): its
    flag, default, type and help; a boolean ``--x/--no-x`` flag becomes ``--x``/``--no-x``."""
    flag = flag_of(cls, name).split("/")[0]
    kwargs: dict[str, Any] = {"default": cli_default_of(cls, name), "dest": name,
                              "help": (help_of(cls, name) + help_suffix).replace("%", "%%")}
    kind = _value_type(cls, name)
    if kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif kind in (int, float) and option_field(cls, name).metadata.get(_CLI_DEFAULT) is None:  # not text ("128MB")
        kwargs["type"] = kind
    kwargs.update(argparse_kwargs)
    parser.add_argument(flag, **kwargs)


def _value_type(cls: type, name: str) -> Any:
    """The field's type without ``None`` (``int | None`` -> int): what argparse converts to."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [k for k in typing.get_args(hint) if k is not type(None)]
        hint = kinds[0] if len(kinds) == 1 else str
    return hint


def borrow(cls: type, name: str, *, help_suffix: str = "") -> Any:
    """A field of another options object taking ``cls.name``'s option as it is declared there (its
    default, flag and help, plus ``help_suffix``): a configuration that gathers options of
    several objects (storage-bench's matrix) declares none of them again."""
    f = option_field(cls, name)
    factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
    return option(f.default, help=help_of(cls, name) + help_suffix, flag=f.metadata.get(_FLAG),
                  cli_default=f.metadata.get(_CLI_DEFAULT), factory=factory)
