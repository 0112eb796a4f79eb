#!/usr/bin/env bash
# make demo: the storage A/B on this machine. Generates a reference-shaped dataset (one .npy
# per volume, like the whitepaper's), converts it, trains from the small files and from the
# compacted stores, all on local disk behind the same emulated Azure Blob latency, on this CPU
# and on emulated T4 and H100 nodes, and writes the report; then reproduces the published case
# (scenarios/reference-azure-databricks.toml) beside its four published times. 5.5 minutes on
# 2 vCPUs (AMD EPYC, 2026-11-27), after the install (3 minutes with pip's cache warm, 10 cold).
set -euo pipefail
OUT=${1:-demo-out}
BIN=.venv/bin
COUNT=${DEMO_COUNT:-1500}
mkdir -p "$OUT"
if [ ! -f "$OUT/volumes/labels.csv" ]; then
  rm -rf "$OUT/volumes"
  echo "== generating $COUNT volumes of 30x30x10x10 float32 (360 KB each, one .npy file per sample)"
  $BIN/storage-bench generate volumes "$OUT/volumes" --count "$COUNT" --seed 1
fi
rm -rf "$OUT/ab"
echo "== storage A/B: blob vs every format of the registry, all behind emulated Azure Blob latency, on cpu + emulated t4, h100"
$BIN/storage-bench run "$OUT/volumes" --out "$OUT/ab" --nodes cpu,t4,h100 \
  --steps 20 --cpu-steps 4 --batch-size 32 --workers 4 --storage-backend local --storage-profile azure-blob \
  --baseline-loader name=generator,concurrency=1,prefetch=off
echo
sed -n '/## What to do/,/## vCPUs to feed/p' "$OUT/ab/report.md" | sed '$d'
rm -rf "$OUT/reference"
echo "== the published case (DeepIQ, Azure Databricks): scenarios/reference-azure-databricks.toml"
$BIN/storage-bench run --scenario scenarios/reference-azure-databricks.toml --out "$OUT/reference"
echo
sed -n '/## Reference case/,/Knobs and their sources/p' "$OUT/reference/report.md" | sed '$d'
echo "Open $OUT/ab/report.html and $OUT/reference/report.html (or their report.md)."
