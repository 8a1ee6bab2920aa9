"""The numbakv sidecar: serves what the engine's processes recorded in a prometheus-client multiprocess directory.

Imports ``numbakv.metrics`` (metric names, the directory's files) and the package's version, nothing
else of numbakv, so it runs without NumPy or Numba.
"""

from numbakv import __version__

__all__ = ["__version__"]
