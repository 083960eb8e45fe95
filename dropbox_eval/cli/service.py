"""Commands that run something: the service, the HTTP API, the sandbox; and `status`."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import ConfigError
from ..service import Service
from ..store.servicestate import already_running, running_status, service_running
from . import FOLDERS, FORGE, Context, uses
from .output import emit_json, friendly_errors, json_option

if TYPE_CHECKING:
    from ..app import App
    from ..sandbox import SandboxOptions

# sandbox.lane_config.LANE_MODES, not imported: the sandbox (FastAPI) loads only when used
LANE_MODES = ("labels", "pulls")
F = TypeVar("F", bound=Callable[..., Any])


def lane_option(default: str | None, help_text: str) -> Callable[[F], F]:
    """`--lane labels|pulls`: the sandbox lane's mode (None: `SANDBOX_LANE_MODE`)."""
    return click.option(
        "--lane", type=click.Choice(LANE_MODES), default=default, show_default=True, help=help_text
    )


def sandbox_options(lane: str | None) -> SandboxOptions:
    """`SANDBOX_*` settings, with the lane mode from `--lane` when given."""
    from ..sandbox import SandboxOptions

    options = SandboxOptions.from_env()
    return options if lane is None else options.model_copy(update={"lane_mode": lane})


@click.command()
@click.option("--once", is_flag=True, help="Process what is there, poll, emit, exit.")
@click.option("--sandbox", is_flag=True, help="Run the embedded sandbox forge and lane.")
@click.option(
    "--lane-delay",
    type=float,
    default=2.0,
    show_default=True,
    help="With --sandbox: seconds before the simulated lane closes an issue.",
)
@lane_option(None, "With --sandbox: the lane's protocol (default: SANDBOX_LANE_MODE).")
@click.option(
    "--polling/--no-polling",
    default=None,
    help="Poll the inbox, or use inotify (default: poll only an inbox on NFS, SMB/CIFS, 9p, "
    "virtiofs or FUSE; SAAS_EVAL_POLLING).",
)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    envvar="SAAS_EVAL_HTTP_PORT",
    show_envvar=True,
    help="Also serve the API, /metrics, /healthz, /readyz and /operator on this port.",
)
@click.option(
    "--http-host",
    default="127.0.0.1",
    show_default=True,
    envvar="SAAS_EVAL_HTTP_HOST",
    show_envvar=True,
    help="Address the HTTP server listens on (with --http-port).",
)
@uses(*FOLDERS, *FORGE, "poll_interval", "task_price")
@click.pass_obj
def run(
    obj: Context,
    once: bool,
    sandbox: bool,
    lane_delay: float,
    lane: str | None,
    polling: bool | None,
    http_port: int | None,
    http_host: str,
) -> None:
    """Run the service: watch the inbox, open issues, poll, emit (until SIGINT/SIGTERM)."""
    with friendly_errors():
        state = obj.settings().state_path
        if sandbox and service_running(state):  # before starting a forge for nothing
            raise already_running(state)
    with friendly_errors(), _maybe_sandbox(obj, sandbox, lane_delay, lane) as extra:
        obj.settings(**extra).require_forge()  # before a state folder is made
        app, service = obj.service(create=not once, polling=polling, **extra)
        with _http(app, service, http_host, http_port):
            code = service.run(once=once)
    sys.exit(code)


@contextlib.contextmanager
def _http(app: App, service: Service, host: str, port: int | None) -> Iterator[None]:
    """The HTTP server inside the service, for as long as it runs."""
    if port is None:
        yield
        return
    from ..util.webserver import BackgroundServer
    from ..web.server import create_web

    def status() -> dict[str, Any] | None:
        if service.stop_event.is_set() or not service_running(service.settings.state_path):
            return None
        return service.live_status()

    server = BackgroundServer(create_web(app.web, status), host=host, port=port, name="http")
    try:
        url = server.start()
    except RuntimeError as exc:
        raise ConfigError(f"--http-port {port}: {exc} (is the port in use?)") from None
    logging.getLogger("dropbox_eval").info("operator page at %s/operator", url)
    try:
        yield
    finally:
        server.stop()


@contextlib.contextmanager
def _maybe_sandbox(
    obj: Context, enabled: bool, lane_delay: float, lane: str | None
) -> Iterator[dict[str, Any]]:
    if not enabled:
        yield {}
        return
    from ..sandbox import SandboxForge

    with SandboxForge.from_env(lane_delay=lane_delay, options=sandbox_options(lane)) as forge:
        logging.getLogger("dropbox_eval").info(
            "sandbox forge at %s (token %s)", forge.url, forge.token
        )
        yield {
            "gitea_url": forge.url,
            "gitea_token": forge.token,
            "owner": forge.user,
            "repo": None,
        }


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@uses(*FOLDERS, *FORGE, "task_price")
@click.pass_obj
def serve(obj: Context, host: str, port: int) -> None:
    """Serve the HTTP API (OpenAPI at /docs), /metrics, /healthz, /readyz and /operator."""
    import uvicorn

    from ..web.server import create_web

    with friendly_errors():
        app = obj.app()
        web = create_web(app.web, lambda: running_status(app.settings.state_path))
    # proxy_headers off: X-Forwarded-For is believed only from SAAS_EVAL_TRUSTED_PROXIES
    uvicorn.run(web, host=host, port=port, log_level="info", log_config=None, proxy_headers=False)


@click.command()
@click.option(
    "--port", type=int, default=3000, show_default=True, help="Port on 127.0.0.1 (0: any free)."
)
@click.option(
    "--lane-delay",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds before the simulated lane closes an issue (negative: no lane).",
)
@lane_option(None, "The lane's protocol (default: SANDBOX_LANE_MODE).")
@json_option
def sandbox(port: int, lane_delay: float, lane: str | None, as_json: bool) -> None:
    """Run the sandbox forge (Gitea API subset + simulated lane) alone; prints the settings
    that point the service at it, and the tokens of the lane and of a human user."""
    from ..sandbox import HUMAN, LANE_BOT, SandboxForge

    delay = lane_delay if lane_delay >= 0 else None
    with friendly_errors(as_json):
        options = sandbox_options(lane)
        forge_run = SandboxForge.from_env(port=port, lane_delay=delay, options=options)
    with forge_run as forge:
        shown = {
            "SAAS_EVAL_GITEA_URL": forge.url,
            "SAAS_EVAL_GITEA_TOKEN": forge.token,
            "SAAS_EVAL_OWNER": forge.user,
            "SAAS_EVAL_LANE_LOGIN": LANE_BOT,
            "SANDBOX_LANE_TOKEN": forge.users[LANE_BOT],
            "SANDBOX_HUMAN": HUMAN,
            "SANDBOX_HUMAN_TOKEN": forge.users[HUMAN],
        }
        if as_json:
            emit_json(shown, lines=True)
        else:
            click.echo("\n".join(f"{name}={value}" for name, value in shown.items()))
        sys.stdout.flush()
        click.echo("sandbox forge running; Ctrl-C stops it", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


COMMANDS = [run, serve, sandbox]
