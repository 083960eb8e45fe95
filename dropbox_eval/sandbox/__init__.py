"""Gitea-compatible in-memory sandbox forge and simulated lane for demos and tests."""

from .faults import RequestLogEntry
from .lane import SimulatedLane
from .server import SandboxForge
from .state import ForgeState

__all__ = ["ForgeState", "RequestLogEntry", "SandboxForge", "SimulatedLane"]
