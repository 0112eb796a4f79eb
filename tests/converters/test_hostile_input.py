"""Hostile source files (issue #8): each one gives `error: FILE: problem` and exit 1 under
--on-error fail, a rejects entry under --on-error skip with the valid samples converted, and
never a hang, an unbounded read or a traceback."""
from __future__ import annotations

import io
import json
import os
import resource
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npformat
from PIL import Image

import trainfeed
from tests.conftest import write_volumes
from tests.converters.formats.test_roundtrip import TARGETS, stored
from trainfeed.converters.formats import parquet
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.sources import decode as sources
from trainfeed.converters.sources.decode import ImageOptions
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import list_source
from trainfeed.converters.sources.samples import load_sample
from trainfeed.converters.verify import reference_sample, same_value

REPO = Path(__file__).resolve().parents[2]


def store_name(fmt: str) -> str:
    return "out.h5" if fmt == "hdf5" else f"out.{fmt}"


def rejects_of(summary: dict) -> list[dict]:
    return [json.loads(line) for line in Path(summary["rejects_report"]).read_text().splitlines()]


def convert_fail_then_skip(convert_cli, src: Path, dst: Path, fmt: str, shown: str, reason: str, *args) -> dict:
    """Fail mode: exit 1, `error: SHOWN: ...REASON...`, nothing written. Skip mode: one rejects
    entry for SHOWN. Returns the skip run's summary."""
    res = convert_cli(src, dst, "--to", fmt, *args)
    assert res.exit_code == 1, res.stderr
    assert res.stderr.startswith(f"error: {shown}: ") and reason in res.stderr, res.stderr
    assert "unexpected" not in res.stderr and "Traceback" not in res.stderr
    assert not dst.exists()
    res = convert_cli(src, dst, "--to", fmt, "--on-error", "skip", "--json", *args)
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    (reject,) = rejects_of(summary)
    assert reject["file"] == shown and reason in reject["reason"], reject
    return summary


# ---------------------------------------------------------------- 1. .npy headers


def npy_with_header(shape: tuple, descr: str = "<f4", payload: bytes = b"\0" * 64) -> bytes:
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def npy_of(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


HOSTILE_NPY = {
    "overflowing shape": (npy_with_header((2**62, 2**62)),
                          f"corrupt or truncated .npy: header promises {2**126} bytes of float32"),
    "shape -1": (npy_with_header((-1,)), "corrupt .npy: header shape (-1,) has a negative dimension"),
    "shape -1, -1": (npy_with_header((-1, -1)), "corrupt .npy: header shape (-1, -1) has a negative dimension"),
    "negative dimension": (npy_with_header((6, -5, 4, 3)), "header shape (6, -5, 4, 3) has a negative dimension"),
    "complex64": (npy_of(np.zeros(3, np.complex64)), "dtype complex64 (complex numbers) is not supported"),
    "complex128": (npy_of(np.zeros(3, np.complex128)), "dtype complex128 (complex numbers) is not supported"),
    "structured": (npy_of(np.zeros(3, [("a", "<i4"), ("b", "<f4")])),
                   "(records (a structured dtype)) is not supported"),
    "object": (npy_of(np.array([{"a": 1}], dtype=object)), "holds a pickled object array"),
    "datetime": (npy_of(np.zeros(3, "datetime64[s]")), "dtype datetime64[s] (dates and times) is not supported"),
    "timedelta": (npy_of(np.zeros(3, "timedelta64[ms]")), "dtype timedelta64[ms] (time spans) is not supported"),
    "unicode": (npy_of(np.array(["abc"])), "dtype <U3 (text) is not supported"),
    "bytes": (npy_of(np.array([b"abc"])), "dtype |S3 (byte strings) is not supported"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_NPY))
def test_hostile_npy_header(tmp_path, convert_cli, case):
    src = tmp_path / "vols"
    truth = write_volumes(src, 6, labels_csv=False)
    data, reason = HOSTILE_NPY[case]
    bad = src / "v003.npy"
    bad.write_bytes(data)
    dst = tmp_path / "out.parquet"
    summary = convert_fail_then_skip(convert_cli, src, dst, "parquet", str(bad), reason)
    assert summary["samples"] == 5
    got = {sid: f["volume"] for sid, _, f in parquet.read_samples(dst)}
    assert set(got) == set(truth) - {"v003"}
    assert all(got[sid].tobytes() == truth[sid][0].tobytes() for sid in got)


# ---------------------------------------------------------------- 2. .npz members


def write_npz_source(src: Path, n: int) -> dict[str, dict[str, np.ndarray]]:
    src.mkdir()
    rng = np.random.default_rng(5)
    truth = {}
    for i in range(n):
        fields = {"ct": rng.integers(-100, 100, (3, 4), dtype=np.int16), "dose": rng.standard_normal(5)}
        np.savez(src / f"s{i}.npz", **fields)
        truth[f"s{i}"] = fields
    return truth


def add_member(npz: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(npz, "a") as zf:
        zf.writestr(name, data)


@pytest.mark.parametrize("member,data,reason", [
    ("notes.txt", b"scanned on the old machine\n", ".npz member 'notes.txt' is not a .npy array"),
    ("huge.npy", npy_with_header((2**62, 2**62)), ".npz member 'huge.npy': corrupt or truncated .npy: header promises"),
    ("neg.npy", npy_with_header((-1,)), ".npz member 'neg.npy': corrupt .npy: header shape (-1,) has a negative"),
    ("cplx.npy", npy_of(np.zeros(2, np.complex64)), ".npz member 'cplx.npy': dtype complex64 (complex numbers)"),
])
def test_hostile_npz_member(tmp_path, convert_cli, member, data, reason):
    src = tmp_path / "npz"
    truth = write_npz_source(src, 4)
    bad = src / "s2.npz"
    add_member(bad, member, data)
    dst = tmp_path / "out.h5"
    convert_fail_then_skip(convert_cli, src, dst, "hdf5", str(bad), reason)
    got = {sid: f for sid, _, f in FORMATS["hdf5"].read_samples(dst)}
    assert set(got) == set(truth) - {"s2"}
    assert all(np.array_equal(got[sid][k], truth[sid][k]) for sid in got for k in ("ct", "dose"))


# ---------------------------------------------------------------- 3. file names that are not UTF-8


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5"])
def test_file_name_that_is_not_utf8(tmp_path, convert_cli, fmt):
    src = tmp_path / "vols"
    truth = write_volumes(src, 5)
    with open(os.fsencode(src) + b"/bad\xff.npy", "wb") as fh:
        np.save(fh, truth["v000"][0])
    dst = tmp_path / store_name(fmt)
    shown = f"{src}/bad\\xff.npy"
    summary = convert_fail_then_skip(convert_cli, src, dst, fmt, shown, "file name is not valid UTF-8",
                                     "--labels", src / "labels.csv")
    assert rejects_of(summary) == [{"file": shown, "id": "bad\\xff", "reason": "file name is not valid UTF-8"}]
    rows = {sid: (label, f["volume"]) for sid, label, f in FORMATS[fmt].read_samples(dst)}
    assert set(rows) == set(truth)
    assert all(rows[sid][0] == lab and rows[sid][1].tobytes() == arr.tobytes() for sid, (arr, lab) in truth.items())


# ---------------------------------------------------------------- 5. FIFOs, devices, files that grow


def limit_memory() -> None:
    """In the child: a regression that reads /dev/zero fails with MemoryError, not the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def convert_subprocess(*args) -> subprocess.CompletedProcess:
    """The CLI in its own process: a conversion that blocks on a FIFO fails the test at 60 s."""
    return subprocess.run([sys.executable, "-m", "trainfeed.converters", *map(str, args), "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, preexec_fn=limit_memory)


def make_fifo(path: Path) -> str:
    os.mkfifo(path)
    return "not a regular file (a FIFO)"


def make_zero_device(path: Path) -> str:
    path.symlink_to("/dev/zero")
    return "not a regular file (a character device)"


@pytest.mark.parametrize("make", [make_fifo, make_zero_device], ids=["fifo", "dev-zero"])
def test_special_file_is_rejected_without_reading_it(tmp_path, make):
    src = tmp_path / "vols"
    truth = write_volumes(src, 5, labels_csv=False)
    bad = src / "v001x.npy"
    reason = make(bad)
    dst = tmp_path / "out.parquet"
    res = convert_subprocess(src, dst, "--to", "parquet")
    assert res.returncode == 1, res.stderr
    assert res.stderr == f"error: {bad}: {reason}\n"
    res = convert_subprocess(src, dst, "--to", "parquet", "--on-error", "skip", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert rejects_of(summary) == [{"file": str(bad), "id": "v001x", "reason": reason}]
    got = {sid: f["volume"] for sid, _, f in parquet.read_samples(dst)}
    assert set(got) == set(truth) and all(got[s].tobytes() == truth[s][0].tobytes() for s in got)


def test_read_stops_at_the_listed_size_when_a_file_grows(tmp_path):
    src = tmp_path / "vols"
    truth = write_volumes(src, 2, labels_csv=False)
    fs, listing = list_source(str(src))
    first = listing.files[0]
    with open(first.path, "ab") as fh:  # grows after it was listed
        fh.write(b"\0" * 100_000)
    sample = load_sample(fs, listing.kind, first, Labels(None), ImageOptions())
    assert sample.nbytes_in == first.size == os.path.getsize(first.path) - 100_000
    assert sample.fields["volume"].tobytes() == truth["v000"][0].tobytes()


def test_npy_read_stops_where_its_header_says(tmp_path):
    """A large file whose header promises a small array: only the header's bytes are read."""
    src = tmp_path / "vols"
    src.mkdir()
    arr = np.arange(10, dtype=np.float32)
    (src / "x.npy").write_bytes(npy_of(arr) + b"\xff" * (2 << 20))
    fs, listing = list_source(str(src))
    (only,) = listing.files
    sample = load_sample(fs, listing.kind, only, Labels(None), ImageOptions())
    assert only.size > 2 << 20 and sample.nbytes_in <= sources.NPY_HEADER_READ
    assert sample.fields["volume"].tobytes() == arr.tobytes()


def test_large_npy_is_read_as_header_then_payload(tmp_path):
    src = tmp_path / "vols"
    src.mkdir()
    arr = np.arange(400_000, dtype=np.float32).reshape(400, 1000)  # 1.6 MB: more than one read
    np.save(src / "x.npy", arr)
    fs, listing = list_source(str(src))
    (only,) = listing.files
    sample = load_sample(fs, listing.kind, only, Labels(None), ImageOptions())
    assert np.array_equal(sample.fields["volume"], arr) and sample.fields["volume"].shape == (400, 1000)


# ---------------------------------------------------------------- 7. 16-bit images


def gray16(seed: int, shape=(9, 7)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 65536, shape, dtype=np.uint16)


def png_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def png16_rgb(pixels: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (Pillow does not write them)."""
    h, w, _ = pixels.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\0" + pixels[y].astype(">u2").tobytes() for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def write_gray16(src: Path, n: int) -> dict[str, np.ndarray]:
    truth = {}
    for i in range(n):
        cls = "a" if i % 2 == 0 else "b"
        (src / cls).mkdir(parents=True, exist_ok=True)
        truth[f"{cls}/img{i}"] = gray16(i)
        (src / cls / f"img{i}.png").write_bytes(png_bytes(truth[f"{cls}/img{i}"]))
    return truth


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5"])
def test_16bit_png_decoded_keeps_every_bit(tmp_path, convert_cli, fmt):
    src = tmp_path / "pngs"
    truth = write_gray16(src, 4)
    assert max(a.max() for a in truth.values()) > 255
    dst = tmp_path / store_name(fmt)
    res = convert_cli(src, dst, "--to", fmt, "--image-storage", "decoded", "--image-mode", "L", "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["fields"] == [{"name": "image", "dtype": "uint16", "shape": [9, 7],
                                                 "encoding": "raw"}]
    got = {sid: f["image"] for sid, _, f in FORMATS[fmt].read_samples(dst)}
    assert set(got) == set(truth)
    for sid, pixels in truth.items():
        assert got[sid].dtype == np.uint16 and got[sid].tobytes() == pixels.tobytes()


def test_16bit_png_resized_stays_16bit(tmp_path, convert_cli):
    src = tmp_path / "pngs"
    truth = write_gray16(src, 2)
    dst = tmp_path / "o.h5"
    res = convert_cli(src, dst, "--to", "hdf5", "--image-storage", "decoded", "--image-mode", "L", "--resize", "4x3")
    assert res.exit_code == 0, res.stderr
    for sid, _, fields in FORMATS["hdf5"].read_samples(dst):
        expected = np.asarray(Image.fromarray(truth[sid]).resize((3, 4), Image.Resampling.BILINEAR))
        assert fields["image"].dtype == np.uint16 and np.array_equal(fields["image"], expected)


def test_16bit_gray_png_in_rgb_mode_is_refused(tmp_path, convert_cli):
    src = tmp_path / "pngs"
    write_gray16(src, 1)
    for sid in ("a/img8", "b/img9"):
        (src / f"{sid}.png").parent.mkdir(exist_ok=True)
        (src / f"{sid}.png").write_bytes(png_bytes(np.full((9, 7, 3), 200, np.uint8)))
    bad = src / "a" / "img0.png"
    convert_fail_then_skip(convert_cli, src, tmp_path / "o.parquet", "parquet", str(bad),
                           "16-bit grayscale image: --image-mode RGB would cut it to 8 bits; use --image-mode L",
                           "--image-storage", "decoded")


def test_16bit_colour_png(tmp_path, convert_cli):
    """Pillow reads 16-bit colour PNGs as 8 bits: decoding them is refused, their bytes are kept."""
    src = tmp_path / "pngs"
    (src / "a").mkdir(parents=True)
    pixels = np.random.default_rng(1).integers(0, 65536, (5, 4, 3), dtype=np.uint16)
    blob = png16_rgb(pixels)
    bad = src / "a" / "deep.png"
    bad.write_bytes(blob)
    (src / "a" / "flat.png").write_bytes(png_bytes(np.full((5, 4, 3), 7, np.uint8)))
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--image-storage", "decoded")
    assert res.exit_code == 1 and res.stderr.startswith(f"error: {bad}: 16-bit colour PNG: Pillow decodes it to 8 bits")
    (src / "a" / "flat.png").unlink()
    dst = tmp_path / "enc.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["fields"][0]["dtype"] == "uint16"
    ((_, _, fields),) = parquet.read_samples(dst)
    assert fields["image"] == blob


@pytest.mark.parametrize("resize", [None, "4x3"])
def test_a_16bit_colour_png_is_taken_at_8_bits_with_reduce_depth(tmp_path, convert_cli, resize):
    """--reduce-depth: each 16-bit value's high byte, decoded, resized and verified as such."""
    src = tmp_path / "pngs"
    (src / "a").mkdir(parents=True)
    pixels = np.random.default_rng(2).integers(0, 65536, (5, 4, 3), dtype=np.uint16)
    (src / "a" / "deep.png").write_bytes(png16_rgb(pixels))
    dst = tmp_path / "o.h5"
    extra = ["--resize", resize] if resize else []
    res = convert_cli(src, dst, "--to", "hdf5", "--image-storage", "decoded", "--reduce-depth", "--verify", *extra)
    assert res.exit_code == 0, res.stderr
    high = (pixels >> 8).astype(np.uint8)
    expected = np.asarray(Image.fromarray(high).resize((3, 4), Image.Resampling.BILINEAR)) if resize else high
    ((_, _, fields),) = FORMATS["hdf5"].read_samples(dst)
    assert fields["image"].dtype == np.uint8 and fields["image"].tobytes() == expected.tobytes()


def test_a_16bit_gray_png_in_rgb_mode_is_scaled_to_8_bits_with_reduce_depth(tmp_path):
    """Scaled by the image's own maximum, not cut to its high byte, and counted in the summary."""
    src = tmp_path / "pngs"
    truth = write_gray16(src, 2)
    dst = tmp_path / "o.h5"
    result = trainfeed.convert(str(src), str(dst), format="hdf5", image_storage="decoded", reduce_depth=True,
                               verify=True)
    assert result.depth_changed == 2
    got = {sid: f["image"] for sid, _, f in FORMATS["hdf5"].read_samples(dst)}
    for sid, gray in truth.items():
        scaled = np.rint(gray.astype(np.float64) * (255 / gray.max())).astype(np.uint8)
        assert got[sid].tobytes() == np.stack([scaled] * 3, axis=-1).tobytes()
    # without it, the API's refusal names the keyword that takes such an image
    with pytest.raises(trainfeed.TrainfeedError, match=r"reduce_depth=True"):
        trainfeed.convert(str(src), str(tmp_path / "p.h5"), format="hdf5", image_storage="decoded")


def test_verify_compares_decoded_images_with_their_exact_pixels(tmp_path):
    src = tmp_path / "pngs"
    truth = write_gray16(src, 2)
    fs, listing = list_source(str(src))
    labels = Labels({f.id: 0 for f in listing.files})
    opts = ImageOptions(storage="decoded", mode="L")
    for src_file in listing.files:
        exact = reference_sample(fs, listing.kind, src_file, labels, opts).fields["image"]
        assert exact.dtype == np.uint16 and exact.tobytes() == truth[src_file.id].tobytes()
        clipped = np.asarray(Image.fromarray(truth[src_file.id]).convert("L"))  # what 8-bit storage kept
        assert not same_value(clipped, exact)
        assert same_value(truth[src_file.id], exact)


# ---------------------------------------------------------------- 8. float16


@pytest.mark.parametrize("fmt,name,tensor_column", TARGETS)
def test_float16_volumes_round_trip_bit_for_bit(tmp_path, convert_cli, fmt, name, tensor_column):
    src = tmp_path / "half"
    truth = write_volumes(src, 5, dtype="float16")
    specials = np.array([np.inf, -np.inf, -0.0, 6e-8, 65504, np.nan], dtype=np.float16)
    specials[5] = np.frombuffer(b"\x01\x7e", dtype=np.float16)[0]  # a NaN with a payload
    np.save(src / "v999.npy", np.resize(specials, truth["v000"][0].shape))
    truth["v999"] = (np.load(src / "v999.npy"), None)
    dst = tmp_path / name
    args = [src, dst, "--to", fmt, "--verify", "--json", "--no-folder-labels"]
    if tensor_column:
        args += ["--tensor-column", tensor_column]
    res = convert_cli(*args)
    if tensor_column == "list":
        assert res.exit_code == 2
        assert "--tensor-column list cannot hold float16 field 'volume'" in res.stderr
        assert "use --tensor-column binary" in res.stderr and not dst.exists()
        return
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["fields"][0]["dtype"] == "float16"
    rows = stored(fmt, dst)
    assert set(rows) == set(truth)
    for sid, (arr, _) in truth.items():
        got = rows[sid][1]["volume"]
        assert got.dtype == np.float16 and got.shape == arr.shape and got.tobytes() == arr.tobytes()


# ---------------------------------------------------------------- the call_timeout option


def test_call_timeout_must_be_seconds(tmp_path, volumes, convert_cli):
    src, _ = volumes
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--storage-option", "call_timeout=soon")
    assert res.exit_code == 2
    assert "--storage-option call_timeout expects a number of seconds (0: no limit), got 'soon'" in res.stderr


def test_npy_headers_parse_safely_from_many_threads():
    """numpy parses .npy headers with ast; on CPython 3.11/3.12 two threads doing that at once
    can raise SystemError (gh-106905). Frequent garbage collection that yields the GIL mid-parse
    makes the race near-certain without trainfeed's lock."""
    script = textwrap.dedent("""
        import gc, io, sys, time
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np
        from trainfeed.converters.sources.decode import decode_npy
        buf = io.BytesIO(); np.save(buf, np.arange(900, dtype=np.float32).reshape(30, 30))
        data = buf.getvalue()
        sys.setswitchinterval(1e-6); gc.set_threshold(5); gc.callbacks.append(lambda *a: time.sleep(0))
        def parse(_):
            for _ in range(1000):
                assert np.array_equal(decode_npy("x.npy", data)["volume"],
                                      np.arange(900, dtype=np.float32).reshape(30, 30))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(parse, range(8)))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
