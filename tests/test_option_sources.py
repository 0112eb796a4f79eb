"""Issue #33 (3): each option is declared once, in its options object. The public functions'
keywords, the typer commands' flags and the Spark jobs' arguments are checked against those
declarations here: a keyword with another default, a flag with its own help text, an
options field a function forgot (``tf_dataset`` once had no ``shuffle_buffer``) fail."""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing

import pytest
from typer.models import OptionInfo

import trainfeed
from trainfeed.benchmarks import cli as bench_cli
from trainfeed.benchmarks.ab.config import MatrixConfig, ReportConfig
from trainfeed.benchmarks.report import report
from trainfeed.converters import cli as convert_cli
from trainfeed.converters.convert import ConvertConfig
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.options import OpenOptions, WriteOptions
from trainfeed.converters.option_docs import cli_default_of, default_of, documented, flag_of, help_of
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions
from trainfeed.pipelines import train as train_job
from trainfeed.training import cli as train_cli
from trainfeed.training.config import TrainConfig
from trainfeed.training.reading.store import EpochOptions

OPTION_CLASSES = (OpenOptions, EpochOptions, TrainConfig, WriteOptions, ImageOptions, ArrayOptions, ForeignSchema,
                  ConvertConfig, MatrixConfig, ReportConfig)
#: Keywords named otherwise than their field: (options class, keyword) -> field.
RENAMED = {(ForeignSchema, "tensor_encoding"): "encoding", (ImageOptions, "image_storage"): "storage",
           (ImageOptions, "image_mode"): "mode", (ConvertConfig, "labels"): "labels_csv"}
#: Options that count only beside another (a table another tool wrote: its tensor column):
#: their keywords and flags default to None, "not given".
ONLY_BESIDE_ANOTHER = (ForeignSchema,)
#: Fields a reader takes from its process rather than from a keyword.
FROM_THE_PROCESS = {"rank", "world_size"}


def _keywords(function: typing.Callable[..., object]) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _same_default(keyword: inspect.Parameter, cls: type, name: str) -> bool:
    """A keyword's default is the field's; None stands for an empty mapping or sequence."""
    declared = default_of(cls, name)
    format_default = (cls, name) == (WriteOptions, "compression")  # None: the format's default codec
    if keyword.default is None and (cls in ONLY_BESIDE_ANOTHER or declared in ({}, (), []) or format_default):
        return True
    return keyword.default in (declared, cli_default_of(cls, name))  # sizes: 128MB as text or bytes


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("function", "cls", "required"), [
    (trainfeed.open_store, OpenOptions, _fields(OpenOptions) - {"foreign"}),
    (trainfeed.open_store, ForeignSchema, set()),
    (trainfeed.Store.batches, EpochOptions, _fields(EpochOptions)),
    (trainfeed.tf_dataset, EpochOptions, _fields(EpochOptions)),
    (trainfeed.TorchDataset.__init__, EpochOptions, _fields(EpochOptions) - FROM_THE_PROCESS),
    (trainfeed.convert, ArrayOptions, _fields(ArrayOptions)),
    (report.build, ReportConfig, {"target_samples", "target_epochs", "catalog", "my_instance"}),
    (trainfeed.convert, ImageOptions, _fields(ImageOptions)),
    (trainfeed.convert, WriteOptions, _fields(WriteOptions)),
    (trainfeed.convert, ConvertConfig, {"labels_csv", "classes", "folder_labels", "workers", "on_error", "verify",
                                        "storage_options"}),
], ids=lambda v: getattr(v, "__qualname__", None) or "fields")
def test_public_keywords_are_the_options_fields(function, cls, required):
    """Every keyword that names a field has the field's default, and a function that takes an
    options object takes a keyword for each of its fields (``options=`` holds them all)."""
    keywords = _keywords(function)
    by_field = {RENAMED.get((cls, k), k): p for k, p in keywords.items()}
    wrong = {name: (by_field[name].default, default_of(cls, name)) for name in _fields(cls) & by_field.keys()
             if not _same_default(by_field[name], cls, name)}
    assert not wrong, f"{function.__qualname__}: keyword defaults differ from {cls.__name__}'s: {wrong}"
    missing = required - by_field.keys()
    assert not missing, f"{function.__qualname__} has no keyword for {cls.__name__}'s {sorted(missing)}"


def _typer_options(command: typing.Callable[..., object]) -> dict[str, OptionInfo]:
    """A typer command's options by their first flag."""
    options = {}
    for p in inspect.signature(command).parameters.values():
        if isinstance(p.default, OptionInfo):
            first = (p.default.param_decls or ("--" + p.name.replace("_", "-"),))[0]
            options[first.split("/")[0]] = p.default
    return options


def _flags(classes: tuple[type, ...] = OPTION_CLASSES) -> dict[str, list[tuple[type, str]]]:
    """Every declared option's flag -> the (class, field) declaring it."""
    out: dict[str, list[tuple[type, str]]] = {}
    for cls in classes:
        for name in documented(cls):
            out.setdefault(flag_of(cls, name).split("/")[0], []).append((cls, name))
    return out


@pytest.mark.parametrize(("command", "classes"), [
    (train_cli.main_command, (TrainConfig, OpenOptions, EpochOptions, ForeignSchema)),
    (convert_cli.main_command, (WriteOptions, ImageOptions, ArrayOptions, ConvertConfig)),
    (bench_cli.run, (MatrixConfig, ArrayOptions, ReportConfig)),
    (bench_cli.report, (ReportConfig,)),
], ids=["train", "convert", "storage-bench run", "storage-bench report"])
def test_command_flags_are_made_from_the_declarations(command, classes):
    """A flag of an options object the command is made from carries that declaration's help
    (the command may add to it) and default (or None, for an option that only counts beside
    another): never a second description of its own."""
    flags, everywhere = _flags(classes), _flags()
    checked = 0
    for flag, info in _typer_options(command).items():
        if flag not in flags:
            continue
        owners = everywhere[flag]  # e.g. storage-bench's --channels: train's (reading) declaration
        matching = [(cls, name) for cls, name in owners if (info.help or "").startswith(help_of(cls, name))]
        assert matching, f"{command.__module__} {flag}: its help is not any declaration's: {info.help!r}"
        cls, name = max(matching, key=lambda owner: len(help_of(*owner)))  # the most specific declaration
        default = dataclasses.MISSING if info.default is ... else info.default
        declared = cli_default_of(cls, name)
        empty = (default, declared) in (([], {}), ([], ()))
        train_augments = (cls, name) == (EpochOptions, "augment")  # training augments unless told not to
        assert default in (declared, None) or empty or train_augments, \
            f"{flag}: default {default!r}, declared {cli_default_of(cls, name)!r}"
        checked += 1
    assert checked >= 5


def test_storage_bench_reads_every_store_with_trains_fit_and_channels():
    options = _typer_options(bench_cli.run)
    assert options["--fit"].help.startswith(help_of(OpenOptions, "fit"))
    assert options["--io-concurrency"].help.startswith(help_of(OpenOptions, "io_concurrency"))
    assert options["--image-mode"].help.startswith(help_of(ImageOptions, "mode"))
    assert options["--channels"].help == help_of(TrainConfig, "channels")


def test_the_spark_benchmark_job_takes_storage_bench_declarations():
    from trainfeed.pipelines import benchmark

    args = benchmark.parse_args(["run", "--src", "s", "--out", "o", "--label", "cpu-node", "--labels", "l.csv"])
    assert (args.labels_csv, args.steps, args.batch_size) == ("l.csv", default_of(MatrixConfig, "steps"),
                                                              default_of(MatrixConfig, "batch_size"))
    assert (args.nodes, args.workers, args.storage_profile) == ("cpu", 8, "none")  # a cluster node's own defaults


def test_the_train_command_declares_nothing_of_its_own_that_an_options_object_holds():
    """Every field of TrainConfig, OpenOptions and EpochOptions the command takes is made from
    its declaration; the ones it leaves out are said here."""
    made = {flag for flag, info in _typer_options(train_cli.main_command).items()
            if any((info.help or "").startswith(help_of(c, n)) for c, n in _flags().get(flag, []))}
    declared = {flag_of(cls, name).split("/")[0] for cls in (TrainConfig, OpenOptions, EpochOptions)
                for name in documented(cls)}
    assert declared - made == {"--shuffle", "--drop-last", "--rank", "--world-size"}


def test_train_config_composes_the_reading_options_and_repeats_none():
    names = _fields(TrainConfig)
    assert not names & (_fields(OpenOptions) | _fields(EpochOptions))
    cfg = TrainConfig(data="d", store=OpenOptions(io_concurrency=3), epoch=EpochOptions(global_batch_size=8))
    assert cfg.epoch_options(1, 2) == EpochOptions(batch_size=4, global_batch_size=8, rank=1, world_size=2)
    assert TrainConfig(data="d").epoch.augment is True  # training augments encoded images unless told not to
    assert (TrainConfig(data="d", cli=True).option("io_concurrency"), TrainConfig(data="d").option("version"),
            TrainConfig(data="d", cli=True).option("version")) == ("--io-concurrency ", "version=", "--delta-version ")


def test_the_spark_training_job_takes_the_same_declarations():
    parser = train_job.build_parser()
    by_dest = {a.dest: a for a in parser._actions if isinstance(a, argparse.Action)}
    for cls, name in ((TrainConfig, "epochs"), (EpochOptions, "batch_size"), (EpochOptions, "global_batch_size"),
                      (OpenOptions, "version"), (TrainConfig, "resume")):
        action = by_dest[name]
        assert action.option_strings[0] == flag_of(cls, name).split("/")[0]
        assert action.help == help_of(cls, name).replace("%", "%%") and action.default == default_of(cls, name)
    args = parser.parse_args(["--data", "d", "--out", "o", "--delta-version", "3", "--global-batch-size", "64"])
    cfg = train_job.config_of(args)
    assert (cfg.store.version, cfg.epoch.global_batch_size, cfg.epoch.batch_size) == (3, 64, 32)


def test_the_spark_repack_takes_converts_declarations():
    from trainfeed.pipelines import repack

    args = repack.parse_args(["--src", "s", "--dst", "d", "--to", "delta", "--ragged", "--dtype", "auto"])
    assert (args.ragged, args.dtype, args.channels) == (True, "auto", None)
    names = ("target_file_size", "row_group_size", "compression", "tensor_column")  # sizes parsed from "128MB"
    assert tuple(getattr(args, name) for name in names) == tuple(default_of(WriteOptions, name) for name in names)
    with pytest.raises(SystemExit):  # --to offers the registry's writable table formats only
        repack.parse_args(["--src", "s", "--dst", "d", "--to", "hdf5"])
