"""Labels from a CSV, from class folders, or none; and the CSV's own failure modes."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import write_volumes
from trainfeed.converters.formats import delta, hdf5, parquet


def labels_of(path) -> dict:
    return {sid: label for sid, label, _ in parquet.read_samples(path)}


def test_integer_labels_from_csv(tmp_path, volumes, convert_cli):
    src, truth = volumes
    dst = tmp_path / "o.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--labels", src / "labels.csv", "--json")
    summary = json.loads(res.stdout)
    assert summary["labels"] == "csv" and summary["label_map"] is None
    assert summary["ignored_files"] == 1  # labels.csv itself sits in the source folder
    assert labels_of(dst) == {sid: lab for sid, (_, lab) in truth.items()}


def test_class_name_labels_from_csv_get_a_stored_map(tmp_path, convert_cli):
    src = tmp_path / "v"
    truth = write_volumes(src, 6, labels_csv=False)
    names = ["tumour", "healthy", "unsure"]
    (tmp_path / "l.csv").write_text("id,label\n" + "".join(f"{sid},{names[i % 3]}\n" for i, sid in enumerate(truth)))
    dst = tmp_path / "o.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--labels", tmp_path / "l.csv", "--json")
    label_map = {"healthy": 0, "tumour": 1, "unsure": 2}
    assert json.loads(res.stdout)["label_map"] == label_map
    assert labels_of(dst) == {sid: label_map[names[i % 3]] for i, sid in enumerate(truth)}
    assert parquet.read_schema(dst).label_map == label_map


def test_folder_labels(tmp_path, convert_cli):
    src = tmp_path / "v"
    truth = write_volumes(src, 10, folders=True)
    for fmt, name, mod in (("parquet", "o.parquet", parquet), ("delta", "o.delta", delta), ("hdf5", "o.h5", hdf5)):
        res = convert_cli(src, tmp_path / name, "--to", fmt, "--json")
        assert json.loads(res.stdout)["label_map"] == {"neg": 0, "pos": 1}
        got = {sid: label for sid, label, _ in mod.read_samples(tmp_path / name)}
        assert got == {sid: lab for sid, (_, lab) in truth.items()}
        assert all(sid.startswith(("neg/", "pos/")) for sid in got)
        assert mod.read_schema(tmp_path / name).label_map == {"neg": 0, "pos": 1}


def test_no_folder_labels_gives_unlabeled(tmp_path, convert_cli):
    src = tmp_path / "v"
    write_volumes(src, 4, folders=True)
    dst = tmp_path / "o.h5"
    res = convert_cli(src, dst, "--to", "hdf5", "--no-folder-labels", "--json")
    assert json.loads(res.stdout)["labels"] == "none"
    assert not hdf5.read_schema(dst).labeled
    assert {label for _, label, _ in hdf5.read_samples(dst)} == {None}


def test_csv_that_misses_a_file(tmp_path, volumes, convert_cli):
    src, truth = volumes
    csv_path = tmp_path / "partial.csv"
    lines = (src / "labels.csv").read_text().splitlines()
    csv_path.write_text("\n".join(line for line in lines if not line.startswith("v004,")) + "\n")
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path)
    assert res.exit_code == 1
    assert f"{src / 'v004.npy'}: no label for id 'v004' in {csv_path}" in res.stderr
    assert not (tmp_path / "o.parquet").exists()
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path, "--on-error", "skip",
                      "--json")
    summary = json.loads(res.stdout)
    assert summary["samples"] == len(truth) - 1 and summary["rejected"] == 1
    reject = json.loads(Path(summary["rejects_report"]).read_text())
    assert reject["id"] == "v004" and "no label" in reject["reason"]


def test_csv_that_names_a_file_twice(tmp_path, volumes, convert_cli):
    src, _ = volumes
    csv_path = tmp_path / "dup.csv"
    csv_path.write_text((src / "labels.csv").read_text() + "v003,1\n")
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path)
    assert res.exit_code == 1
    assert f"{csv_path}, line 32: id 'v003' is listed twice (first on line 5)" in res.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_csv_ids_without_files_are_counted(tmp_path, volumes, convert_cli):
    src, truth = volumes
    csv_path = tmp_path / "extra.csv"
    csv_path.write_text((src / "labels.csv").read_text() + "ghost,1\nphantom,0\n")
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path, "--json")
    assert res.exit_code == 0
    summary = json.loads(res.stdout)
    assert summary["labels_unmatched"] == 2 and summary["samples"] == len(truth)


@pytest.mark.parametrize("content,message", [
    ("name,class\nv000,1\n", "needs a header with columns 'id' and 'label'"),
    ("id,label\n", "labels file has no rows"),
    ("id,label\nv000,\n", "line 2: empty label for id 'v000'"),
])
def test_malformed_csv(tmp_path, volumes, convert_cli, content, message):
    src, _ = volumes
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text(content)
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path)
    assert res.exit_code == 1 and str(csv_path) in res.stderr and message in res.stderr


def test_missing_csv(tmp_path, volumes, convert_cli):
    src, _ = volumes
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", tmp_path / "none.csv")
    assert res.exit_code == 1 and "none.csv: labels file not found" in res.stderr


def test_delta_append_refuses_ids_already_in_the_table(tmp_path, volumes, convert_cli):
    src, truth = volumes
    dst = tmp_path / "t.delta"
    assert convert_cli(src, dst, "--to", "delta", "--labels", src / "labels.csv").exit_code == 0
    res = convert_cli(src, dst, "--to", "delta", "--labels", src / "labels.csv", "--mode", "append")
    assert res.exit_code == 1 and "id 'v000' is already in the Delta table" in res.stderr
    assert delta.open_table(dst).version() == 0
    assert delta.read_schema(dst).samples == len(truth)


def test_delta_append_of_other_fields_is_refused(tmp_path, volumes, convert_cli):
    src, _ = volumes
    dst = tmp_path / "t.delta"
    assert convert_cli(src, dst, "--to", "delta").exit_code == 0
    other = tmp_path / "other"
    write_volumes(other, 3, shape=(2, 2, 2, 2), labels_csv=False)
    for f in other.glob("*.npy"):
        f.rename(other / f"o_{f.name}")
    res = convert_cli(other, dst, "--to", "delta", "--mode", "append")
    assert res.exit_code == 1 and "cannot append" in res.stderr
    assert delta.open_table(dst).version() == 0


def test_delta_append_to_a_new_destination_creates_the_table(tmp_path, volumes, convert_cli):
    src, truth = volumes
    dst = tmp_path / "fresh.delta"
    res = convert_cli(src, dst, "--to", "delta", "--mode", "append", "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    assert delta.read_schema(dst).samples == len(truth) and delta.open_table(dst).version() == 0


@pytest.mark.parametrize("label", [str(2**63), str(-(2**63) - 1), "123456789012345678901234567890"])
def test_label_outside_int64_names_its_line(tmp_path, volumes, convert_cli, label):
    src, _ = volumes
    csv_path = tmp_path / "big.csv"
    lines = (src / "labels.csv").read_text().splitlines()
    lines[4] = f"v003,{label}"
    csv_path.write_text("\n".join(lines) + "\n")
    for on_error in ("fail", "skip"):  # the labels file is wrong, not one sample: nothing is converted
        res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path, "--on-error", on_error)
        assert res.exit_code == 1
        assert res.stderr == f"error: {csv_path}, line 5: label {label} does not fit in a 64-bit integer\n"
        assert not (tmp_path / "o.parquet").exists()


def volumes_labelled(tmp_path, labels: list) -> tuple:
    """Volumes under tmp_path/v and a CSV giving them ``labels`` in order: (src, csv, id -> label)."""
    src = tmp_path / "v"
    wanted = dict(zip(write_volumes(src, len(labels), labels_csv=False), labels))
    csv_path = tmp_path / "l.csv"
    csv_path.write_text("id,label\n" + "".join(f"{sid},{lab}\n" for sid, lab in wanted.items()))
    return src, csv_path, wanted


def test_int64_limits_are_labels(tmp_path, convert_cli):
    src, csv_path, wanted = volumes_labelled(tmp_path, [2**63 - 1, -(2**63), 0])
    dst = tmp_path / "o.parquet"
    assert convert_cli(src, dst, "--to", "parquet", "--labels", csv_path, "--verify").exit_code == 0
    assert labels_of(dst) == wanted


@pytest.mark.parametrize("labels,line,message", [
    (["1", "2", "cat", "10"], 4, "label 'cat' is a class name, but line 2 has the integer label '1'"),
    (["cat", "dog", "2", "bird"], 4, "label '2' is an integer, but line 2 has the class name 'cat'"),
    (["0", "1.5", "1"], 3, "label '1.5' is a class name, but line 2 has the integer label '0'"),
])
def test_mixed_integer_and_class_name_labels(tmp_path, convert_cli, labels, line, message):
    src, csv_path, _ = volumes_labelled(tmp_path, labels)
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path)
    assert res.exit_code == 1
    assert res.stderr == f"error: {csv_path}, line {line}: {message}; use integer labels or class names throughout\n"
    assert not (tmp_path / "o.parquet").exists()


def test_integer_labels_are_numbers_not_sorted_names(tmp_path, convert_cli):
    src, csv_path, wanted = volumes_labelled(tmp_path, [10, 2, 1])
    dst = tmp_path / "o.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--labels", csv_path, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["label_map"] is None
    assert labels_of(dst) == wanted


@pytest.mark.parametrize("header,column,times", [
    ("id,label,label", "label", 2), ("id,id,label", "id", 2), ("label, id ,label,label ", "label", 3),
])
def test_duplicated_header_column(tmp_path, volumes, convert_cli, header, column, times):
    src, _ = volumes
    csv_path = tmp_path / "dup.csv"
    width = len(header.split(","))
    csv_path.write_text(header + "\n" + "v000" + ",1" * (width - 1) + "\n")
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--labels", csv_path)
    assert res.exit_code == 1
    assert res.stderr == (f"error: {csv_path}: header names column {column!r} {times} times "
                          "(which one holds the labels?); keep one\n")


def test_labels_from_a_pipe(tmp_path, volumes, convert_cli):
    """--labels <(...): a FIFO is read as it comes (it cannot be seeked)."""
    src, truth = volumes
    fifo = tmp_path / "labels.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=((src / "labels.csv").read_text(),), daemon=True)
    writer.start()  # blocks in open() until the conversion opens the FIFO for reading
    dst = tmp_path / "o.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--labels", fifo)
    writer.join(timeout=30)
    assert res.exit_code == 0, res.stderr
    assert labels_of(dst) == {sid: lab for sid, (_, lab) in truth.items()}
