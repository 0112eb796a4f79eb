"""Developer micro-benchmarks behind `make bench-*`: one measured question each, JSON lines out.
Not part of `storage-bench`."""
