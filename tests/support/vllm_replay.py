"""What the vLLM manager and policy tests replay: benchmarks/vllm_manager.py, which drives a manager
as vLLM 0.32's connector does, and requests that share prefixes. Import it once vLLM imports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark():
    """benchmarks/vllm_manager.py, whose replay drives a manager as vLLM 0.32's connector does."""
    sys.path.insert(0, str(BENCHMARKS))  # for its sibling vllm_baseline
    try:
        spec = importlib.util.spec_from_file_location(
            "vllm_manager", BENCHMARKS / "vllm_manager.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


BENCH = _benchmark()


@st.composite
def prefix_sharing_chains(draw):
    """Requests that share leading runs of blocks, as prompts of one conversation do."""
    chains, next_block = [], 0
    for _ in range(draw(st.integers(1, 40))):
        base = draw(st.sampled_from(chains)) if chains and draw(st.booleans()) else []
        shared = base[: draw(st.integers(0, len(base)))]
        fresh = draw(st.integers(0 if shared else 1, 6))
        chains.append(shared + list(range(next_block, next_block + fresh)))
        next_block += fresh
    return chains
