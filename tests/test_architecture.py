"""The walls of docs/ARCHITECTURE.md: the manager side runs where Numba is absent."""

import subprocess
import sys

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
