"""Sighting ARC: the policy (`policy`), how often blocks seen once come back by the shape of the
request that stored them (`reuse_classes`), whether chain ends come back (`chain_ends`), its ghost
lists (`ghosts`), and the miniature simulations that choose its bound (`miniatures`)."""

from numbakv.policies.sarc.policy import SightingARCPolicy

__all__ = ["SightingARCPolicy"]
