"""Without a GPU the data path chooses Numba's CUDA simulator itself, and says so in one line."""

import os
import subprocess
import sys

import pytest

from numbakv.simulator import has_cuda_driver

pytestmark = pytest.mark.skipif(has_cuda_driver(), reason="this machine has an NVIDIA driver")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def test_the_data_path_runs_on_the_simulator_and_says_so_once():
    done = _python(
        "import numbakv.datapath\n"
        "from numbakv.datapath._device import ON_SIMULATOR\n"
        "assert ON_SIMULATOR\n"
    )
    assert done.returncode == 0, done.stderr
    said = (
        "numbakv: no NVIDIA driver here: the data path runs on Numba's CUDA simulator, an "
        "interpreter (small sizes only; transfers are not timed)"
    )
    assert done.stderr.splitlines() == [said]


def test_numba_cuda_imported_first_gets_one_line_naming_the_fix():
    done = _python("import numba.cuda\nimport numbakv.datapath\n")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "RuntimeError: numbakv: no NVIDIA driver here, and Numba CUDA was imported before numbakv "
        "could choose its simulator: set NUMBA_ENABLE_CUDASIM=1 before Python starts, or import "
        "numbakv.datapath before numba.cuda"
    )
