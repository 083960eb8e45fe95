"""The SFTP endpoint: SSH with public-key logins, SFTP only, one jailed folder per client.

It runs beside the service (`dropbox-eval sftp` next to `dropbox-eval run`, same settings)
and never talks to it: an upload is renamed into place on close, which the service's inotify
watcher reads at once (see filesystem.py). What the SSH side allows:

- authentication: public keys only (password and keyboard-interactive are not offered);
  the SSH user name is the client id and the key must be one of that client's keys
  (keys.py); a reserved client id (names.py: `accepted`, `rejected`, ...) never logs in.
  A source address with `sftp_max_auth_failures` failed logins within
  `sftp_failure_window` seconds is disconnected as soon as it connects.
- channels: the `sftp` subsystem only. No shell, no exec (so no legacy `scp -O`; OpenSSH's
  `scp` uses SFTP since 9.0), no pty, no port, agent or X11 forwarding.
- at most `sftp_max_sessions` authenticated connections per client at once.

Accounting: one log line per session and per uploaded file (client, key fingerprint, source
address, bytes, outcome), plus the batch id or rejection once the service has filed the
upload (looked up best-effort in `accepted/` and `rejected/` for a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncssh
from filelock import Timeout

from ..config import Settings
from ..errors import AlreadyRunning
from ..names import reserved_reason
from ..secrecy import make_state_private
from .filesystem import JailedSFTPServer
from .keys import KeyStore
from .paths import DIR_FLAGS, sweep_uploads
from .ratelimit import FailureLimiter, SessionCounter
from .status import endpoint_lock, load_or_create_host_key, write_status

log = logging.getLogger("dropbox_eval")

BATCH_LOOKUP_SECONDS = 60.0
BATCH_LOOKUP_EVERY = 0.25


@dataclass
class Session:
    """One authenticated connection, for the accounting lines."""

    client_id: str
    fingerprint: str
    peer: str
    started: float = field(default_factory=time.monotonic)
    files: int = 0
    bytes: int = 0

    def who(self) -> str:
        """`client=... key=... from=...` for log lines."""
        return f"client={self.client_id} key={self.fingerprint} from={self.peer}"


class Endpoint:
    """Host key, key store, limits and the live sessions; `listen` starts the SSH server."""

    def __init__(self, settings: Settings) -> None:
        """Creates the host key on first use (under the state folder)."""
        self.settings = settings
        self.keys = KeyStore(settings.state_path)
        self.limiter = FailureLimiter(settings.sftp_max_auth_failures, settings.sftp_failure_window)
        self.counter = SessionCounter(settings.sftp_max_sessions)
        self.host_key = load_or_create_host_key(settings.state_path)
        self.fingerprint: str = self.host_key.get_fingerprint("sha256")
        self.live: dict[object, Session] = {}
        self._lookups: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> asyncssh.SSHAcceptor:
        """Start accepting connections (port 0 picks a free port)."""
        self.settings.inbox_path.mkdir(parents=True, exist_ok=True)
        return await asyncssh.create_server(
            lambda: _Gate(self),
            host,
            port,
            server_host_keys=[self.host_key],
            sftp_factory=self._sftp_factory,
            allow_scp=False,
            session_factory=None,
            process_factory=None,
            allow_pty=False,
            agent_forwarding=False,
            x11_forwarding=False,
            password_auth=False,
            kbdint_auth=False,
            public_key_auth=True,
            keepalive_interval=30,
        )

    def _sftp_factory(self, chan: asyncssh.SSHServerChannel[bytes]) -> JailedSFTPServer:
        session = self.live[chan.get_connection()]
        folder = self.settings.inbox_path / session.client_id

        def report(name: str, size: int, outcome: str, digest: str | None) -> None:
            self._file_done(session, name, size, outcome, digest)

        try:
            return JailedSFTPServer(chan, folder, self.settings.max_file_bytes, report)
        except OSError as exc:  # asyncssh then drops the connection: nothing was opened
            log.warning(
                "sftp: refused session: %s: %s is not a usable folder (%s)",
                session.who(),
                folder,
                exc.strerror,
            )
            raise

    def _file_done(
        self, session: Session, name: str, size: int, outcome: str, digest: str | None
    ) -> None:
        session.files += 1
        session.bytes += size
        log.info("sftp file: %s file=%s bytes=%d outcome=%s", session.who(), name, size, outcome)
        if digest is not None and name.lower().endswith(".json"):
            task = asyncio.get_running_loop().create_task(self._log_batch(session, name, digest))
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    async def _log_batch(self, session: Session, name: str, digest: str) -> None:
        """Log the batch id (or rejection) once the service has filed the upload."""
        folder = self.settings.inbox_path / session.client_id
        deadline = time.monotonic() + BATCH_LOOKUP_SECONDS
        while time.monotonic() < deadline:
            found = find_outcome(folder, name, digest)
            if found is not None:
                log.info("sftp file: %s file=%s %s", session.who(), name, found)
                return
            await asyncio.sleep(BATCH_LOOKUP_EVERY)
        log.info(
            "sftp file: %s file=%s batch=unknown (no receipt with its sha256 within %.0f s)",
            session.who(),
            name,
            BATCH_LOOKUP_SECONDS,
        )

    def opened(self, conn: object, session: Session) -> bool:
        """Register an authenticated connection unless its client is at the session limit."""
        if not self.counter.acquire(session.client_id):
            log.warning(
                "sftp: refused session: %s: already %d sessions (limit %d, "
                "SAAS_EVAL_SFTP_MAX_SESSIONS)",
                session.who(),
                self.counter.count(session.client_id),
                self.counter.limit,
            )
            return False
        self.live[conn] = session
        log.info("sftp session start: %s", session.who())
        return True

    def closed(self, conn: object, exc: Exception | None) -> None:
        """Account for a session that ended."""
        session = self.live.pop(conn, None)
        if session is None:
            return
        self.counter.release(session.client_id)
        outcome = "closed" if exc is None else f"lost ({exc})"
        log.info(
            "sftp session end: %s files=%d bytes=%d seconds=%.1f outcome=%s",
            session.who(),
            session.files,
            session.bytes,
            time.monotonic() - session.started,
            outcome,
        )


class _Gate(asyncssh.SSHServer):
    """Per-connection authentication and limits."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.conn: asyncssh.SSHServerConnection | None = None
        self.peer = "?"
        self.username = ""
        self.fingerprint = ""
        self.tried = False
        self.refused = False
        self.authenticated = False

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else "?"
        self.refused = self.endpoint.limiter.blocked(self.peer)

    def begin_auth(self, username: str) -> bool:
        self.username = username
        reserved = reserved_reason(username)
        if reserved is not None and not self.refused:  # KeyStore.find accepts no key for it
            log.warning("sftp: login as %r from %s refused: %s", username, self.peer, reserved)
        if self.refused:  # the earliest point where the client shows our message
            limiter = self.endpoint.limiter
            log.warning(
                "sftp: refused %s: too many failed logins (limit %d per %.0f s)",
                self.peer,
                limiter.max_failures,
                limiter.window,
            )
            assert self.conn is not None
            self.conn.disconnect(
                asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                "too many failed logins from your address; try again later",
            )
        self.tried = True  # a connection that starts to log in and never succeeds failed
        return True  # authentication is always required

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return not self.refused

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        entry = self.endpoint.keys.find(username, key)
        if entry is None:
            log.info(
                "sftp: key %s from %s not accepted for user %r",
                key.get_fingerprint("sha256"),
                self.peer,
                username,
            )
            return False
        self.fingerprint = entry.fingerprint
        return True

    def auth_completed(self) -> None:
        assert self.conn is not None
        session = Session(self.username, self.fingerprint, self.peer)
        if self.endpoint.opened(self.conn, session):
            self.authenticated = True
            return
        self.conn.disconnect(
            asyncssh.DISC_TOO_MANY_CONNECTIONS,
            f"too many sessions for {self.username} (limit {self.endpoint.counter.limit})",
        )

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.conn is not None
        if self.authenticated:
            self.endpoint.closed(self.conn, exc)
        elif self.tried and not self.refused:
            count = self.endpoint.limiter.failed(self.peer)
            log.warning(
                "sftp: failed login from %s as %r (%d of %d allowed per %.0f s)",
                self.peer,
                self.username,
                count,
                self.endpoint.limiter.max_failures,
                self.endpoint.limiter.window,
            )


def find_outcome(folder: Path, name: str, digest: str) -> str | None:
    """`batch=<id>` or `rejected=<reason>` if the service filed an upload with this sha256."""
    for outcome, suffix in (("accepted", ".receipt.json"), ("rejected", ".error.json")):
        document = _read_json_nofollow(folder, outcome, f"{name}{suffix}")
        if document is None or document.get("sha256") != digest:
            continue
        if outcome == "accepted":
            return f"batch={document.get('batch_id')}"
        return f"rejected={document.get('reason') or document.get('error')}"
    return None


def _read_json_nofollow(folder: Path, outcome: str, name: str) -> dict[str, Any] | None:
    try:
        folder_fd = os.open(folder / outcome, DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    finally:
        os.close(folder_fd)
    return data if isinstance(data, dict) else None


def serve(settings: Settings, host: str, port: int, ready: Callable[[str, int, str], None]) -> None:
    """Run the endpoint until SIGINT/SIGTERM; `ready(host, port, fingerprint)` once listening.

    Raises AlreadyRunning when another endpoint holds this state folder.
    """
    make_state_private(settings.state_path)  # an install from before: 0700 / 0600
    lock = endpoint_lock(settings.state_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise AlreadyRunning(f"an SFTP endpoint already runs on {settings.state_path}") from None
    try:
        asyncio.run(_serve(Endpoint(settings), host, port, ready))
    finally:
        lock.release()


async def _serve(
    endpoint: Endpoint, host: str, port: int, ready: Callable[[str, int, str], None]
) -> None:
    swept = sweep_uploads(endpoint.settings.inbox_path)
    if swept:
        log.warning("sftp: removed %d unfinished upload(s) left by an earlier run", swept)
    acceptor = await endpoint.listen(host, port)
    bound = acceptor.sockets[0].getsockname()[1] if acceptor.sockets else port
    write_status(
        endpoint.settings.state_path,
        {
            "pid": os.getpid(),
            "host": host,
            "port": bound,
            "host_key": endpoint.fingerprint,
            "started_at": datetime.now(UTC).isoformat(),
        },
    )
    log.info("sftp endpoint on %s:%d, host key %s", host, bound, endpoint.fingerprint)
    ready(host, bound, endpoint.fingerprint)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
        acceptor.close()
        await acceptor.wait_closed()
