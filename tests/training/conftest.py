"""Fixtures of the training side's tests (reading, DataLoaders, ranks)."""
from __future__ import annotations

import pytest

from tests.conftest import write_volumes

SHAPE = (4, 4, 2)  # float32: 128 bytes a sample
N = 56  # 7 row groups of 8: DataLoader workers get uneven shares


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """N small volumes and their samples, sorted (bytes, label)."""
    root = tmp_path_factory.mktemp("dl-src")
    truth = write_volumes(root, N, shape=SHAPE, seed=23)
    return root, sorted((a.tobytes(), lab) for a, lab in truth.values())
