"""The numbakv sidecar: serves what the engine's processes recorded in a prometheus-client multiprocess directory.

Imports ``numbakv.metrics`` (metric names, the directory's files) and nothing else of numbakv, so it
runs without NumPy or Numba.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("numbakv")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"
