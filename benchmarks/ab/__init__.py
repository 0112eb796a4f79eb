"""The storage A/B behind `storage-bench run`: the matrix of cells, the storage each runs on, and how
each is measured."""
