"""The walls of docs/ARCHITECTURE.md: the manager side runs where Numba is absent."""

import subprocess
import sys
from pathlib import Path

import tomllib

BLOCK_NUMBA = """
import sys
class NoNumba:
    def find_spec(self, name, path=None, target=None):
        if name == "numba" or name.startswith("numba."):
            raise ImportError("numba is blocked in this test")
sys.meta_path.insert(0, NoNumba())
"""


def test_manager_and_replay_import_without_numba():
    code = BLOCK_NUMBA + (
        "import numbakv, numbakv.replay\n"
        "m = numbakv.CPUOffloadingManager(16, 4)\n"
        "assert m.prepare_store([1]).block_hashes_to_store == [1]\n"
        "assert 'numba' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_package_root_names_resolve_on_first_use():
    code = (
        "import sys, numbakv\n"
        "assert [m for m in sys.modules if m.startswith('numbakv')] == ['numbakv']\n"
        "for name in numbakv.__all__:\n"
        "    getattr(numbakv, name)\n"
        "assert sorted(dir(numbakv)) == sorted(numbakv.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages (service/ and dashboards/ install under numbakv): a folder
    of Python code left out would be missing from a non-editable install."""
    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {value: key for key, value in setuptools["package-dir"].items()}
    found = set()
    for init in [*root.glob("numbakv/**/__init__.py"), *root.glob("service/**/__init__.py")]:
        folder = init.parent.relative_to(root).as_posix()
        top, _, rest = folder.partition("/")
        found.add(".".join(filter(None, [folders.get(top, top), rest.replace("/", ".")])))
    found |= {folders["dashboards"]}
    assert found <= set(setuptools["packages"]), sorted(found - set(setuptools["packages"]))
