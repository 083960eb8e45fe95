"""The SFTP endpoint: SSH with public-key logins, SFTP only, one jailed folder per client.

It runs beside the service (`dropbox-eval sftp` next to `dropbox-eval run`, same settings)
and never talks to it: an upload is renamed into place on close, which the service's inotify
watcher reads at once (see filesystem.py). What the SSH side allows:

- authentication (gate.py): public keys only; the SSH user name is the client id and the
  key must be one of that client's keys; failed logins are limited per source address and
  user name, and an address spraying user names is refused;
- channels: the `sftp` subsystem only. No shell, no exec (so no legacy `scp -O`; OpenSSH's
  `scp` uses SFTP since 9.0), no pty, no port, agent or X11 forwarding;
- at most `sftp_max_sessions` authenticated connections per client at once, and per-client
  bounds on open files and pending bytes (bounds.py).

Accounting: one log line per session and per uploaded file (accounting.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import asyncssh
from filelock import Timeout

from ..config import Settings
from ..errors import AlreadyRunning
from ..store.secrecy import make_state_private
from ..util import timestamps
from ..util.logfilter import AUDIT
from .accounting import FileLog, Session
from .bounds import Bounds, raise_descriptor_limit
from .durable import FolderSyncs
from .filesystem import JailedSFTPServer
from .gate import Gate
from .keys import KeyStore
from .paths import sweep_uploads
from .ratelimit import FailureLimiter, SessionCounter
from .reports import Owners, ReportsView
from .status import endpoint_lock, load_or_create_host_key, write_status

log = logging.getLogger("dropbox_eval")
GIL_SWITCH_SECONDS = 0.001
# AES only: every SSH client has AES-CTR, and asyncssh's chacha20-poly1305 (which OpenSSH's
# client would pick first) builds its ciphers again for every packet: about 15 % of the
# endpoint's CPU per small upload (bench/sftp.py --only uploads).
ENCRYPTION_ALGS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


class Endpoint:
    """Host key, key store, limits and the live sessions; `listen` starts the SSH server."""

    def __init__(self, settings: Settings) -> None:
        """Creates the host key on first use (where the keys are kept: the state folder,
        or the database every node shares)."""
        self.settings = settings
        self.keys = KeyStore(settings.state_path, settings.database_url)
        self.limiter = FailureLimiter(
            settings.sftp_max_auth_failures,
            settings.sftp_max_auth_users,
            settings.sftp_failure_window,
        )
        self.counter = SessionCounter(settings.sftp_max_sessions)
        self.bounds = Bounds(
            settings.sftp_max_open_files,
            settings.sftp_max_client_open_files,
            settings.client_quota_bytes,
        )
        self.owners = Owners(settings.state_path, settings.database_url)
        self.folder_syncs = FolderSyncs()
        self.files = FileLog(settings.inbox_path)
        self.host_key = load_or_create_host_key(settings.state_path, self.keys.kept)
        self.fingerprint: str = self.host_key.get_fingerprint("sha256")
        self.live: dict[object, Session] = {}

    async def listen(self, host: str, port: int) -> asyncssh.SSHAcceptor:
        """Start accepting connections (port 0 picks a free port). A missing inbox is not
        made here (statefolder.make_drop_folders): uploads fail until it is back."""
        return await asyncssh.create_server(
            lambda: Gate(self),
            host,
            port,
            server_host_keys=[self.host_key],
            encryption_algs=ENCRYPTION_ALGS,
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
            self.files.done(session, name, size, outcome, digest)

        try:
            return JailedSFTPServer(
                chan,
                folder,
                self.settings.max_file_bytes,
                report,
                bounds=self.bounds.session(session.client_id),
                reports=ReportsView(self.settings.outbox_path, session.client_id, self.owners),
                folder_sync=self.folder_syncs.of(session.client_id),
                may_upload=lambda: self.keys.session_refusal(
                    session.client_id, session.fingerprint
                ),
            )
        except OSError as exc:  # asyncssh then drops the connection: nothing was opened
            log.warning(
                "sftp: refused session: %s: %s is not a usable folder (%s)",
                session.who(),
                folder,
                exc.strerror,
            )
            raise

    def opened(self, conn: object, session: Session) -> bool:
        """Register an authenticated connection unless its client is at the session limit."""
        if not self.counter.acquire(session.client_id):
            log.warning(
                "sftp: refused session: %s: already %d sessions (limit %d, "
                "SAAS_EVAL_SFTP_MAX_SESSIONS); not counted as a failed login",
                session.who(),
                self.counter.count(session.client_id),
                self.counter.limit,
                extra=AUDIT,
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


def serve(settings: Settings, host: str, port: int, ready: Callable[[str, int, str], None]) -> None:
    """Run the endpoint until SIGINT/SIGTERM; `ready(host, port, fingerprint)` once listening.

    Raises AlreadyRunning when another endpoint holds this state folder.
    """
    make_state_private(settings.state_path)  # an install from before: 0700 / 0600
    raise_descriptor_limit()
    # The event loop shares the interpreter with the worker threads that read listings and
    # the state (listing.py, reports.py): a thread busy in Python holds the loop up until it
    # is made to let go, after 5 ms by default; 1 ms keeps another session's request quick.
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
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
            "started_at": timestamps.now(),
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
        endpoint.owners.close()
        endpoint.keys.close()
