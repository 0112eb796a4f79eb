#!/usr/bin/env bash
# make demo: generate a small reference-shaped dataset (numpy volumes and JPEG folders),
# convert each into Parquet, Delta and HDF5 with --verify, and show what changed.
set -euo pipefail
OUT=${1:-demo-out}
BIN=.venv/bin
rm -rf "$OUT"
mkdir -p "$OUT"
echo "== generating 600 volumes of 30x30x10x10 float32 (216 MB, one .npy each) and 300 JPEGs of 360x480"
$BIN/storage-bench generate volumes "$OUT/volumes" --count 600 --seed 1
$BIN/storage-bench generate images "$OUT/images" --count 300 --seed 1
for fmt in parquet delta hdf5; do
  echo
  echo "== convert volumes -> $fmt"
  $BIN/convert "$OUT/volumes" "$OUT/volumes.$fmt" --to "$fmt" --labels "$OUT/volumes/labels.csv" \
    --target-file-size 64MB --verify
done
echo
echo "== convert JPEG folders -> parquet (encoded) and hdf5 (resized to 64x64, decoded)"
$BIN/convert "$OUT/images" "$OUT/images.parquet" --to parquet --verify
$BIN/convert "$OUT/images" "$OUT/images-64.h5" --to hdf5 --resize 64x64 --image-storage decoded --verify
echo
echo "Stores are in $OUT/. Layouts: docs/LAYOUT.md."
