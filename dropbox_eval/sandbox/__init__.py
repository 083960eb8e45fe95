"""Gitea-compatible in-memory sandbox forge and simulated lane for demos and tests."""

from .clock import ManualClock
from .faults import RequestLogEntry, RequestStart
from .lane import SimulatedLane
from .lane_config import LaneConfig
from .options import SandboxOptions
from .server import SandboxForge
from .state import ForgeState
from .state_base import HUMAN, LANE_BOT

__all__ = [
    "HUMAN",
    "LANE_BOT",
    "ForgeState",
    "LaneConfig",
    "ManualClock",
    "RequestLogEntry",
    "RequestStart",
    "SandboxForge",
    "SandboxOptions",
    "SimulatedLane",
]
