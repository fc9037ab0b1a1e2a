"""Cluster backends behind one interface (see base.Cluster)."""
from .base import Cluster, UnknownTarget, UnsupportedFault

BACKENDS = ("local", "compose", "swarm")

__all__ = ["BACKENDS", "Cluster", "UnknownTarget", "UnsupportedFault"]
