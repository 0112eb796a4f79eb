"""The framework registry: a framework added through its public functions alone is offered
(looked up, listed in the choices, its libraries reported) and is gone once unregistered;
reading the registry imports no framework."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.training import frameworks
from trainfeed.training.frameworks import FRAMEWORKS, Framework, FrameworkRun, Library, framework
from trainfeed.training.metrics import environment


def _no_run(cfg: Any, p: Any) -> FrameworkRun[Any]:
    raise TrainfeedError("the toy framework trains nothing")


def _no_cuda() -> None:
    raise TrainfeedError("--device cuda: the toy framework has no GPU")


def _no_step(shape: tuple[int, ...], batch: int, width: int, steps: int, device: str, amp: bool) -> tuple[float, float]:
    return 0.0, 0.0


#: Reports numpy's version under a name of its own, so that its line in `environment()` is the toy's.
TOY = Framework("toy", "Toy", _no_run, _no_cuda, _no_step, (Library("toy-numpy", ("no-such-dist", "numpy")),))


@pytest.fixture
def toy() -> Iterator[Framework]:
    frameworks.register(TOY)
    try:
        yield TOY
    finally:
        if TOY.name in FRAMEWORKS:
            frameworks.unregister(TOY.name)


def test_the_built_in_frameworks_are_torch_and_tf():
    assert list(FRAMEWORKS) == ["torch", "tf"]
    assert (framework("torch").label, framework("tf").label) == ("PyTorch", "TensorFlow")
    assert framework("torch").data_parallel and not framework("tf").data_parallel
    with pytest.raises(UsageError, match="^unknown framework 'jax': choose torch or tf$"):
        framework("jax")


def test_a_registered_framework_is_offered_until_unregistered(toy: Framework):
    assert framework("toy") is toy
    assert list(FRAMEWORKS) == ["torch", "tf", "toy"]
    assert frameworks.choices() == "torch, tf or toy"
    with pytest.raises(UsageError, match="choose torch, tf or toy$"):
        framework("jax")
    with pytest.raises(ValueError, match="'toy' is registered already"):
        frameworks.register(toy)
    with pytest.raises(TrainfeedError, match="toy framework has no GPU"):
        framework("toy").check_cuda()
    assert environment()["toy-numpy"] == importlib.metadata.version("numpy")  # its libraries reported

    frameworks.unregister("toy")
    assert "toy" not in FRAMEWORKS and "toy-numpy" not in environment()
    with pytest.raises(UsageError, match="choose torch or tf$"):
        framework("toy")


def test_reading_the_registry_imports_no_framework():
    probe = ("import sys; from trainfeed.training.frameworks import FRAMEWORKS; list(FRAMEWORKS.values()); "
             "print(sorted({'torch', 'tensorflow', 'keras'} & set(sys.modules)))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
