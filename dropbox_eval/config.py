"""Settings from `SAAS_EVAL_*` environment variables (and CLI overrides)."""

from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError
from .util.envfile import read_env_file

ENV_PREFIX = "SAAS_EVAL_"
VerdictStatus = Literal["passed", "failed", "no_verdict"]
_REPO_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}/[A-Za-z0-9._-]{1,100}$")


class Settings(BaseSettings):
    """Every knob of the service; relative paths are resolved under `home`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    home: Path = Path(".")
    inbox: Path = Path("inbox")
    output_dir: Path = Path("outbox")
    state_dir: Path = Path("state")
    database_url: str | None = None  # postgresql://...: the store on PostgreSQL
    node_id: str | None = None  # this node among those sharing a database (nodes.py)
    lease_seconds: float = Field(default=30.0, ge=3)  # a silent node's work is taken after
    gitea_url: str | None = None
    gitea_token: str | None = None
    gitea_token_file: Path | None = None
    operator_key: str | None = None
    operator_key_file: Path | None = None
    metrics_token: str | None = None
    metrics_token_file: Path | None = None
    metrics_per_client: bool = False
    owner: str | None = None
    repo: str | None = None
    poll_interval: float = Field(default=30.0, gt=0)
    task_price: int = Field(default=1, ge=0)
    task_label: str = "eval-task"
    pass_label: str = "eval-pass"
    fail_label: str = "eval-fail"
    merged_status: VerdictStatus = "passed"
    unmerged_status: VerdictStatus = "no_verdict"
    pull_details: bool = True
    settle_seconds: float = Field(default=10.0, ge=0)
    lane_login: str = "lane-bot"
    lane_marker: str = "<!-- controller:fingerprint:"
    polling: bool | None = None  # None: poll only an inbox on a network or FUSE mount
    quiet_period: float = Field(default=1.0, ge=0)
    rescan_interval: float = Field(default=30.0, gt=0)
    max_file_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    max_tasks: int = Field(default=10_000, gt=0)
    inbox_client_backlog: int = Field(default=1000, ge=1)  # files of one client tracked at once
    api_client_backlog: int = Field(default=64, ge=1)  # API posts of one client held at once
    api_backlog: int = Field(default=512, ge=1)  # API posts of every client held at once
    intake_concurrency: int = Field(default=4, ge=1, le=1024)  # the budget's starting point
    forge_max_inflight: int = Field(default=64, ge=1, le=1024)
    client_weights: str = ""  # `acme=3,beta=2`: turns per round at the forge (default 1)
    full_poll_every: int = Field(default=10, ge=1)
    webhook_secret: str | None = None
    completion_window: int = Field(default=86_400, ge=60)
    max_completion_window: int = Field(default=7 * 86_400, ge=60)
    callback_allow: str = ""
    trusted_proxies: str = ""  # reverse proxies whose X-Forwarded-For is believed
    delivery_retry_base: float = Field(default=60.0, gt=0)
    delivery_max_attempts: int = Field(default=8, ge=1)
    forge_timeout: float = Field(default=30.0, gt=0)
    forge_webhook_secret: str | None = None
    forge_webhook_url: str | None = None
    retry_base: float = Field(default=5.0, gt=0)
    retry_cap: float = Field(default=600.0, gt=0)
    max_attempts: int = Field(default=20, ge=1)
    callback_timeout: float = Field(default=10.0, gt=0)
    sftp_max_sessions: int = Field(default=4, ge=1)
    sftp_max_auth_failures: int = Field(default=10, ge=1)
    sftp_max_auth_users: int = Field(default=5, ge=1)
    sftp_failure_window: float = Field(default=300.0, gt=0)
    sftp_max_open_files: int = Field(default=16, ge=1)
    sftp_max_client_open_files: int = Field(default=32, ge=1)
    client_quota_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    stale_upload_seconds: float = Field(default=86_400.0, gt=0)
    retention_days: int = Field(default=0, ge=0)  # 0: keep ended batches (ops/retention.py)

    @field_validator("gitea_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _read_secret_files(self) -> Settings:
        """Secrets may come from a file (`*_FILE`, e.g. a mounted secret): never from argv."""
        for name in ("gitea_token", "operator_key", "metrics_token"):
            path = getattr(self, f"{name}_file")
            if getattr(self, name) or path is None:
                continue
            try:
                secret = Path(path).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"{ENV_PREFIX}{name.upper()}_FILE: cannot read it ({exc})"
                ) from None
            if not secret:
                raise ValueError(f"{ENV_PREFIX}{name.upper()}_FILE: {path} is empty")
            setattr(self, name, secret)
        return self

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql:// (unset: TinyDB in the state folder)")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: str) -> str:
        parse_networks(value)
        return value

    @property
    def proxies(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """The networks of the reverse proxies whose X-Forwarded-For is believed."""
        return parse_networks(self.trusted_proxies)

    @field_validator("client_weights")
    @classmethod
    def _check_weights(cls, value: str) -> str:
        parse_weights(value)
        return value

    @property
    def weights(self) -> dict[str, int]:
        """Each named client's turns per round at the forge's scheduler."""
        return parse_weights(self.client_weights)

    @model_validator(mode="after")
    def _check_quota(self) -> Settings:
        if self.client_quota_bytes < self.max_file_bytes:
            raise ValueError(
                f"{ENV_PREFIX}CLIENT_QUOTA_BYTES ({self.client_quota_bytes}) is smaller than "
                f"{ENV_PREFIX}MAX_FILE_BYTES ({self.max_file_bytes}): a file the inbox takes "
                "could not be uploaded; raise the quota"
            )
        return self

    @field_validator("repo")
    @classmethod
    def _check_repo(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not _REPO_RE.match(value):
            raise ValueError("must look like owner/name")
        return value

    def path(self, value: Path) -> Path:
        """Resolve a configured folder against `home`."""
        return value if value.is_absolute() else self.home / value

    @property
    def inbox_path(self) -> Path:
        """Folder clients drop batch files into."""
        return self.path(self.inbox)

    @property
    def outbox_path(self) -> Path:
        """Folder reports are written to."""
        return self.path(self.output_dir)

    @property
    def state_path(self) -> Path:
        """Folder holding the TinyDB files, locks and the service status."""
        return self.path(self.state_dir)

    @property
    def label_results(self) -> dict[str, str]:
        """Lane label -> task status mapping."""
        return {self.pass_label: "passed", self.fail_label: "failed"}

    def require_forge(self) -> None:
        """Raise a one-line error naming what to set unless a forge is fully configured."""
        if not self.gitea_url:
            raise ConfigError(
                f"{ENV_PREFIX}GITEA_URL is not set: point it at your Gitea/Forgejo "
                "server, or run with --sandbox to use the embedded sandbox forge"
            )
        if not self.gitea_token:
            raise ConfigError(
                f"{ENV_PREFIX}GITEA_TOKEN is not set: set it to a token of the forge user, "
                f"or set {ENV_PREFIX}GITEA_TOKEN_FILE to a file holding it "
                "(or run with --sandbox to use the embedded sandbox forge)"
            )
        self.require_owner()

    def require_owner(self) -> str:
        """The user or org owning eval repos, or a one-line error naming what to set."""
        owner = self.owner or (self.repo.split("/")[0] if self.repo else None)
        if not owner:
            raise ConfigError(
                f"{ENV_PREFIX}OWNER is not set: name the user or org that owns eval repos "
                f"(or set {ENV_PREFIX}REPO=owner/name)"
            )
        return owner


class FileSettings(Settings):
    """Settings from an environment file and the command line alone: the shell's
    `SAAS_EVAL_*` variables are not read, as the units that read the file never see them."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the constructor is given (the file's values, then the overrides)."""
        return (init_settings,)


def load_settings(env_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from the environment (or, given `env_file`, from that file instead:
    envfile.py) plus non-None overrides; errors name the variable."""
    given = {key: value for key, value in overrides.items() if value is not None}
    where = f" (in {env_file})" if env_file else ""
    try:
        if env_file is None:
            return Settings(**given)
        return FileSettings(**(read_env_file(env_file, ENV_PREFIX) | given))
    except OSError as exc:
        raise ConfigError(f"--env-file: cannot read {env_file} ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a check across fields names its variable itself
            message = str(first["msg"]).removeprefix("Value error, ")
            raise ConfigError(f"{message}{where}") from None
        field = str(first["loc"][0])
        raise ConfigError(
            f"{ENV_PREFIX}{field.upper()}: {first['msg']} (got {first.get('input')!r}){where}"
        ) from None


def parse_networks(text: str) -> tuple[IPv4Network | IPv6Network, ...]:
    """`127.0.0.1, 10.0.0.0/8` -> networks; ValueError naming the one that is not."""
    networks = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            networks.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network") from None
    return tuple(networks)


def parse_weights(text: str) -> dict[str, int]:
    """`acme=3,beta=2` -> {"acme": 3, "beta": 2}; ValueError saying what is wrong."""
    weights: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        client, sep, number = item.partition("=")
        if not sep or not client.strip() or not number.strip().isdigit():
            raise ValueError(f"{item!r} is not client=N (N a whole number from 1 to 100)")
        weight = int(number)
        if not 1 <= weight <= 100:
            raise ValueError(f"{item!r}: the weight must be from 1 to 100")
        weights[client.strip()] = weight
    return weights
