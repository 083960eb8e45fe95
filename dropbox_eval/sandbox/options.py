"""Start-up options of the sandbox forge, read from `SANDBOX_*` environment variables.

| variable | default | meaning |
|---|---|---|
| SANDBOX_FLAVOR | gitea | `gitea` or `forgejo` quirks |
| SANDBOX_REPO_QUOTA | (none) | Forgejo: repos per owner before 413 |
| SANDBOX_LANE_MODE | labels | `labels` (verdict label + close) or `pulls` (PR closes issue) |
| SANDBOX_MERGE_RATIO | 1.0 | pulls: share of PRs merged, the rest abandoned |
| SANDBOX_MERGE_DELAY | 0 | pulls: seconds from PR opened to merge/abandon |
| SANDBOX_CLOSE_FIRST | false | pulls: close first, verdict label + comment later |
| SANDBOX_COMMENT_LAG | 2 | pulls with close-first: seconds between close and verdict |
| SANDBOX_LANE_SEED | 0 | seed of the merge/abandon draw |
| SANDBOX_LANE_HELD | false | start with every issue held (release via control route) |
| SANDBOX_CAPACITY | 0 | API requests served at once, the rest wait (0: no limit) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..errors import ConfigError
from .flavor import Flavor, FlavorName
from .lane_config import LaneConfig, LaneMode


class SandboxOptions(BaseSettings):
    """Flavour and lane settings; `from_env` reads them from the environment."""

    model_config = SettingsConfigDict(env_prefix="SANDBOX_", extra="ignore")

    flavor: FlavorName = "gitea"
    repo_quota: Annotated[int, Field(ge=0)] | None = None
    lane_mode: LaneMode = "labels"
    merge_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    merge_delay: Annotated[float, Field(ge=0.0)] = 0.0
    close_first: bool = False
    comment_lag: Annotated[float, Field(ge=0.0)] = 2.0
    lane_seed: int = 0
    lane_held: bool = False
    capacity: Annotated[int, Field(ge=0)] = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SandboxOptions:
        """Read `SANDBOX_*` variables (from `environ` if given); ConfigError naming the
        variable when one is invalid (the boundary for pydantic's ValidationError)."""
        try:
            if environ is None:
                return cls()
            values = {
                k[len("SANDBOX_") :].lower(): v
                for k, v in environ.items()
                if k.upper().startswith("SANDBOX_")
            }
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = "_".join(str(p) for p in first["loc"]).upper()
            given = first.get("input")
            shown = f" (got {given!r})" if isinstance(given, str) else ""
            raise ConfigError(f"SANDBOX_{field}: {first['msg']}{shown}") from None

    def forge_flavor(self) -> Flavor:
        """The chosen `Flavor`."""
        return Flavor(self.flavor, self.repo_quota)

    def lane_config(self, delay: float, interval: float = 0.1) -> LaneConfig:
        """The lane settings for a lane closing issues `delay` seconds after creation."""
        return LaneConfig(
            mode=self.lane_mode,
            delay=delay,
            interval=interval,
            merge_ratio=self.merge_ratio,
            merge_delay=self.merge_delay,
            close_first=self.close_first,
            comment_lag=self.comment_lag,
            seed=self.lane_seed,
        )
