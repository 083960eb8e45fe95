"""Hostile callback URLs against real loopback receivers: a callback may reach only the hosts
allowed, checked before and again at connect, and a malformed URL is a clear refusal."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
from conftest import Receiver, read_json, tasks

from dropbox_eval.app import App
from dropbox_eval.delivery.emitter import Emitter, FileEmitter
from dropbox_eval.delivery.webhook import WebhookEmitter
from dropbox_eval.errors import BatchRejected, DeliveryError
from dropbox_eval.protocol.callbacks import CallbackPolicy
from dropbox_eval.sandbox import SandboxForge
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api

REPORT = {"batch_id": "b1", "status": "completed"}


def _port(receiver: Receiver) -> int:
    return int(receiver.url.split(":")[2].split("/")[0])


def _emitter(tmp_path: Path, policy: CallbackPolicy, **kwargs: Any) -> Emitter:
    webhooks = WebhookEmitter(timeout=30, **kwargs)
    return Emitter(FileEmitter(tmp_path / "outbox"), webhooks, policy)


def _refused(policy: CallbackPolicy, url: str) -> BatchRejected:
    with pytest.raises(BatchRejected) as caught:
        policy.check(url)
    assert caught.value.reason == "callback_refused"
    assert caught.value.details["field"] == "callback_url"
    return caught.value


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_backslash_callback_refused(tmp_path: Path, receiver: Receiver) -> None:
    """urlsplit sees 8.8.8.8, urllib3 connects to 127.0.0.1: refused, nothing is sent."""
    url = f"http://127.0.0.1:{_port(receiver)}\\@8.8.8.8/hook"
    assert "backslash" in _refused(CallbackPolicy(), url).message
    with pytest.raises(DeliveryError, match="refused"):
        _emitter(tmp_path, CallbackPolicy()).deliver(REPORT, url)
    assert receiver.received == []
    assert (tmp_path / "outbox" / "undelivered" / "b1.json").exists()


@pytest.mark.parametrize(
    "tail",
    [
        "\\@8.8.8.8/hook",
        "\\\\@8.8.8.8/",
        "\t@8.8.8.8/",
        "\n@8.8.8.8/",
        "\r\n@8.8.8.8/",
        " @8.8.8.8/",
        "\x00@8.8.8.8/",
        "\u3000@8.8.8.8/",
        "/\\@8.8.8.8/",
    ],
)
def test_separator_tricks_refused(receiver: Receiver, tail: str) -> None:
    _refused(CallbackPolicy(), f"http://127.0.0.1:{_port(receiver)}{tail}")


@pytest.mark.parametrize(
    "url",
    [
        "http://8.8.8.8@127.0.0.1/hook",  # user info: classic confusion
        "http://user:pw@8.8.8.8/hook",  # refused too: credentials do not belong here
        "http://8.8.8.8%40127.0.0.1/hook",  # percent-encoding in the authority
        "http://127.0.0.1%2f@8.8.8.8/",
        "http://%31%32%37.0.0.1/hook",
        "http://[::1%25lo]/hook",  # zone id
        "http://127\u30020\u30020\u30021/hook",  # ideographic full stops (IDNA maps them)
        "http://xn--127-0.0.0.1/\u00e9",
        "http://0x7f.1/hook",
        "http://2130706433/hook",
        "http://127.1/hook",  # inet_aton forms
        "http://0177.0.0.1/hook",
        "http://[::ffff:7f00:1]/hook",
        "http://[0:0:0:0:0:0:0:1]/hook",
        "http://localhost./hook",
        "http://LOCALHOST/hook",
        "HTTP://127.0.0.1/hook",
        "http://*.example.com/hook",
        "http://exa mple.com/hook",
        "https:///hook",
        "http:/x/hook",
        "javascript://example.com/%0aalert(1)",
        "file://localhost/etc/passwd",
        "http://example.com:0/hook",
        "http://[fec0::1]/hook",  # site-local: Python counts it as global
        "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
    ],
)
def test_ambiguous_or_internal_urls_refused(url: str) -> None:
    _refused(CallbackPolicy(), url)


def test_userinfo_refused_even_for_allowed_hosts(receiver: Receiver) -> None:
    policy = CallbackPolicy("127.0.0.1")
    assert policy.check(receiver.url).addresses
    refused = _refused(policy, receiver.url.replace("http://", "http://user:pw@"))
    assert "user info" in refused.message


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_rebinding_after_check_is_refused_at_connect(tmp_path: Path, receiver: Receiver) -> None:
    """The name passes the check on one (allowed) address, while the system resolver says
    127.0.0.1 where the receiver listens. The POST goes to the checked address only."""
    port = _port(receiver)
    policy = CallbackPolicy("127.0.0.2", resolver=lambda host, port: ["127.0.0.2"])
    url = f"http://localhost:{port}/hook"  # the system resolves localhost to the receiver
    assert [str(a) for a in policy.check(url).addresses] == ["127.0.0.2"]
    with pytest.raises(DeliveryError, match="unreachable"):
        _emitter(tmp_path, policy).deliver(REPORT, url)
    assert receiver.received == []


def test_delivery_reaches_checked_address_with_host_header(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A name only the injected resolver knows: the POST reaches the checked address and
    still says which host it is for."""
    port = _port(receiver)
    policy = CallbackPolicy("127.0.0.1", resolver=lambda host, port: ["127.0.0.1"])
    where = _emitter(tmp_path, policy).deliver(REPORT, f"http://hooks.example.test:{port}/h?a=1")
    assert "HTTP 200" in where
    headers, body = receiver.received[0]
    assert headers["host"] == f"hooks.example.test:{port}"
    assert json.loads(body)["batch_id"] == "b1"


def test_checked_names_resolving_inside_are_refused() -> None:
    inside = CallbackPolicy(resolver=lambda host, port: ["93.184.216.34", "169.254.169.254"])
    assert "metadata" in _refused(inside, "https://hooks.example.com/x").message
    public = CallbackPolicy(resolver=lambda host, port: ["93.184.216.34"])
    assert [str(a) for a in public.check("https://hooks.example.com/x").addresses] == [
        "93.184.216.34"
    ]


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """A TLS receiver on 127.0.0.1 with a certificate for hooks.example.test only."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hooks.example.test").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hosts.append(str(self.headers["Host"]))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], str(ca_file), hosts
    server.shutdown()
    server.server_close()


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_tls_verifies_the_url_name_not_the_pinned_address(
    tmp_path: Path, tls_receiver: tuple[int, str, list[str]]
) -> None:
    port, ca_file, hosts = tls_receiver
    policy = CallbackPolicy("127.0.0.1", resolver=lambda host, port: ["127.0.0.1"])
    emitter = _emitter(tmp_path, policy, ca_certs=ca_file)
    assert "HTTP 204" in emitter.deliver(REPORT, f"https://hooks.example.test:{port}/h")
    assert hosts == [f"hooks.example.test:{port}"]
    with pytest.raises(DeliveryError, match="unreachable"):
        emitter.deliver(REPORT, f"https://other.example.test:{port}/h")  # wrong certificate
    assert len(hosts) == 1


# -- malformed URLs are a clear refusal, never a ValueError ---------------------------------

MALFORMED = [
    "http://example.com:99999/",
    "http://[::1/",
    "http://example.com:-1/",
    "http://example.com:80:80/",
    "http://example.com:8a/",
    "http://[not-an-ip]/",
    "http://]/",
    "http://[::1]x/",
    "http://",
    "http://:80/",
    "https://?x",
    "http://#",
    "http://a..b/",
    "http://-a.example.com/",
    "http://" + "a" * 3000 + ".com/",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_malformed_callback_refused_by_policy(url: str) -> None:
    _refused(CallbackPolicy(), url)


@pytest.mark.parametrize("url", ["http://example.com:99999/", "http://[::1/"])
def test_malformed_callback_file_ends_in_rejected(
    app: App, forge: SandboxForge, funded: str, url: str
) -> None:
    forge.clear_requests()
    path = app.inbox.root / "cb.json"
    path.write_text(json.dumps({"client_id": funded, "tasks": tasks(1), "callback_url": url}))
    outcome = app.inbox.process(path)
    assert outcome.status == "rejected" and not path.exists()
    error = read_json(app.inbox.root / "rejected" / "cb.json.error.json")
    assert error["reason"] == "callback_refused" and error["field"] == "callback_url"
    assert "not a valid URL" in error["message"]
    assert forge.requests == [] and app.billing.client(funded).held == 0


@pytest.fixture
def api(app: App) -> Iterator[str]:
    server = BackgroundServer(create_api(app.web), name="api")
    yield server.start()
    server.stop()


@pytest.mark.parametrize(
    "url", ["http://example.com:99999/", "http://[::1/", "http://127.0.0.1:9\\@8.8.8.8/hook"]
)
def test_api_answers_422_for_a_bad_callback(
    app: App, api: str, forge: SandboxForge, url: str
) -> None:
    app.billing.add_client("acme", 100)
    key = app.billing.new_api_key("acme")
    forge.clear_requests()
    answer = requests.post(
        f"{api}/api/eval/batches",
        timeout=30,
        headers={"Authorization": f"Bearer {key}"},
        json={"tasks": tasks(1), "callback_url": url},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["reason"] == "callback_refused"
    assert forge.requests == [] and app.billing.client("acme").held == 0


class Trickler:
    """A receiver that answers a POST a byte at a time: its status line, then one header
    line every `pause` s for `lines` lines (a read timeout never fires: bytes keep coming),
    then an empty body with 200."""

    def __init__(self, lines: int = 200, pause: float = 0.2) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lines, self.pause = lines, pause
        self.finished = threading.Event()  # it sent its whole answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.server.accept()
        with connection:
            connection.recv(65536)
            try:
                for byte in b"HTTP/1.1 200 OK\r\n":
                    connection.sendall(bytes([byte]))
                    time.sleep(self.pause / 10)
                for number in range(self.lines):
                    connection.sendall(f"X-Slow-{number}: 1\r\n".encode())
                    time.sleep(self.pause)
                connection.sendall(b"Content-Length: 0\r\n\r\n")
                self.finished.set()
            except OSError:  # the service hung up: what the deadline does
                return

    def close(self) -> None:
        self.server.close()


@pytest.mark.planted_documents  # the emitter is handed a stand-in report
def test_a_receiver_that_trickles_its_answer_is_cut_at_the_deadline(tmp_path: Path) -> None:
    """Each byte arrives well within the read timeout, so only a deadline on the whole
    exchange ends it: the delivery fails, saying so, and the receiver never finished."""
    trickler = Trickler()
    webhooks = WebhookEmitter(timeout=1)
    emitter = Emitter(FileEmitter(tmp_path / "outbox"), webhooks, CallbackPolicy("127.0.0.1"))
    try:
        with pytest.raises(DeliveryError, match=r"did not answer within 2 s"):
            emitter.deliver(REPORT, f"http://127.0.0.1:{trickler.port}/hook")
    finally:
        trickler.close()
    assert not trickler.finished.is_set()
    assert (tmp_path / "outbox" / "undelivered" / "b1.json").exists()
