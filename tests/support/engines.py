"""Whether an engine's tests run: they skip where the engine is not installed, and fail in CI.

.ci/run installs each engine's extra into an environment of its own and runs its tests there with
the engine's variable set to 1 (NUMBAKV_REQUIRE_VLLM, NUMBAKV_REQUIRE_SGLANG), so an engine that
does not import fails CI instead of skipping it.
"""

from __future__ import annotations

import importlib
import os

import pytest


def require_engine(module: str, name: str, extra: str, variable: str) -> None:
    """Skip the calling test module unless `module` imports; fail instead where `variable` is 1.
    `name` is the engine's name in the message, `extra` numbakv's extra that installs it."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        if os.environ.get(variable) == "1":
            raise ImportError(f"{variable}=1 but {name} does not import: {error}") from error
        pytest.skip(
            f"{name} is not installed ({error}); pip install -e '.[{extra}]' to run these tests",
            allow_module_level=True,
        )
