"""The data path's walls: it is imported only on demand and never reaches into the rest of numbakv."""

import ast
from pathlib import Path

from tests.support.imports import loaded_after

ROOT = Path(__file__).resolve().parents[2]


def test_datapath_imports_of_numbakv_only_the_job_vocabulary_the_switch_and_the_check():
    imported = set()
    for source in (ROOT / "numbakv" / "datapath").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    others = {
        name
        for name in imported
        if name.startswith("numbakv") and not name.startswith("numbakv.datapath")
    }
    assert others == {"numbakv.jobs", "numbakv.simulator", "numbakv.checks"}


def test_importing_numbakv_does_not_pull_in_the_datapath_or_numba():
    loaded = loaded_after("import numbakv")
    assert "numbakv.datapath" not in loaded and "numba" not in loaded
