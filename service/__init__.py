"""The numbakv sidecar: serves what the engine's processes recorded in a prometheus-client multiprocess directory.

Imports ``numbakv.metrics`` (for metric names) and nothing else of numbakv, so it runs without Numba.
"""
