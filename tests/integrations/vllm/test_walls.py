"""The walls around the engine integrations (docs/ARCHITECTURE.md): only numbakv/integrations/ imports
vllm, sglang or torch, each engine only under its own folder there, and the scheduler side of the
vLLM spec never loads the data path."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import loaded_after

ROOT = Path(__file__).resolve().parents[3]
ENGINES = {"vllm", "sglang", "torch"}


def _imported_roots(source: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
    return roots


def test_only_the_integrations_import_an_engine_or_torch():
    sources = [*(ROOT / "numbakv").rglob("*.py"), *(ROOT / "service").rglob("*.py")]
    offenders = {
        str(source.relative_to(ROOT)): sorted(_imported_roots(source) & ENGINES)
        for source in sources
        if "integrations" not in source.parts and _imported_roots(source) & ENGINES
    }
    assert offenders == {}


def test_each_engine_is_imported_only_under_its_own_integration():
    """vLLM under numbakv/integrations/vllm/, SGLang under numbakv/integrations/sglang/."""
    offenders = {
        str(source.relative_to(ROOT)): engine
        for source in (ROOT / "numbakv").rglob("*.py")
        for engine in sorted(_imported_roots(source) & {"vllm", "sglang"})
        if ROOT / "numbakv" / "integrations" / engine not in source.parents
    }
    assert offenders == {}


def test_the_workers_transfer_core_imports_neither_vllm_nor_torch_at_load():
    source = ROOT / "numbakv" / "datapath" / "chunks.py"
    tree = ast.parse(source.read_text())
    top_level = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert top_level & ENGINES == set()


def test_numbakv_its_manager_metrics_and_sidecar_load_neither_vllm_nor_torch():
    """Meaningful where vLLM is installed (the vLLM test environment of .ci/run)."""
    loaded = loaded_after(
        "import numbakv, numbakv.manager, numbakv.metrics, numbakv.replay, numbakv.service.app"
    )
    assert {module.split(".")[0] for module in loaded} & ENGINES == set()


def test_the_scheduler_side_of_the_spec_never_loads_the_data_path():
    from tests.support.vllm_support import require_vllm

    require_vllm()
    loaded = loaded_after(
        "from numbakv.integrations.vllm import NumbaKVOffloadingSpec\n"
        "from tests.support.vllm_support import offloading_config\n"
        "spec = NumbaKVOffloadingSpec(offloading_config({'cpu_bytes_to_use': 1 << 20}))\n"
        "assert spec.get_manager().manager.num_blocks == 256"
    )
    assert "numbakv.integrations.vllm.scheduler" in loaded
    assert not {"numbakv.datapath", "numbakv.integrations.vllm.worker", "numba.cuda"} & loaded
