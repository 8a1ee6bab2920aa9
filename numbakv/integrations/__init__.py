"""Adapters to inference engines' own interfaces: the only part of numbakv that imports an engine.

Each adapter keeps the walls of the rest of numbakv: its scheduler half uses the manager and never
the data path; its worker half uses the data path.
"""
