"""TensorFlow as trainfeed imports it: oneDNN on unless the user says otherwise, and its native
start-up notices kept off stderr while anything else written there is kept."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainfeed.training import tensorflow_env

PROBE = ("from trainfeed.training.tensorflow_env import import_tensorflow; import_tensorflow(); "
         "from tensorflow.python.util import _pywrap_util_port; import sys; "
         "print(bool(_pywrap_util_port.IsMklEnabled())); print('after', file=sys.stderr)")


def _probe(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")}
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={**clean, **env})


@pytest.mark.tf
def test_tensorflow_runs_with_onednn_and_prints_no_start_up_notice():
    res = _probe()
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True"]  # on, on every CPU (TensorFlow's own default leaves AVX2-only CPUs off)
    assert res.stderr.splitlines() == ["after"], res.stderr


@pytest.mark.tf
def test_the_users_own_setting_wins():
    res = _probe(TF_ENABLE_ONEDNN_OPTS="0")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False"]


def test_only_the_notices_are_held_back(capfd):
    """Native code writes to file descriptor 2: a notice there goes, any other line stays."""
    with tensorflow_env._without_notices():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"a real problem\n")
        os.write(2, b"I0000 port.cc:153] oneDNN custom operations are on. You may see ...\n")
    assert capfd.readouterr().err == "a real problem\n"
