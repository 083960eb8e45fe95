"""The operator page's door, over real HTTP.

Sign-in attempts are throttled per source address (a delay that doubles, answered 429 with
`Retry-After`, the right key included); the key is never read from a URL; every answer
carries the security headers, and the page's CSP allows exactly its own stylesheet.
A second source address is a reverse proxy's `X-Forwarded-For` from loopback, listed as
a trusted proxy (SAAS_EVAL_TRUSTED_PROXIES) as a proxy on this host would be.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import OPERATOR_KEY, wait_for

from dropbox_eval.app import App
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.server import create_web
from dropbox_eval.web.throttle import FREE_FAILURES, MAX_DELAY, LoginThrottle

KEY = OPERATOR_KEY


@pytest.fixture
def served(app: App) -> Iterator[tuple[str, LoginThrottle]]:
    """The web app with an operator key behind a trusted proxy on this host, and its sign-in
    throttle (to move its clock)."""
    app.settings.operator_key = KEY
    app.settings.trusted_proxies = "127.0.0.1"
    api = create_web(app.web, lambda: {})
    server = BackgroundServer(api)
    yield server.start(), api.state.login_throttle
    server.stop()


def sign_in(url: str, key: str, source: str | None = None) -> requests.Response:
    headers = {"X-Forwarded-For": source} if source else {}
    return requests.post(
        f"{url}/operator/login",
        data={"key": key},
        headers=headers,
        allow_redirects=False,
        timeout=30,
    )


def test_wrong_keys_close_the_door_of_that_source_and_the_right_key_waits_too(
    served: tuple[str, LoginThrottle],
) -> None:
    url, _ = served
    for _ in range(FREE_FAILURES):  # typing errors cost nothing
        wrong = sign_in(url, "nope")
        assert wrong.status_code == 401 and "wait" not in wrong.text
    wrong = sign_in(url, "nope")
    assert wrong.status_code == 401 and "wait 1 s before the next try" in wrong.text
    right = sign_in(url, KEY)  # at once: the right key is not even looked at
    assert right.status_code == 429 and int(right.headers["Retry-After"]) >= 1
    assert "too many wrong keys from your address" in right.text
    assert "set-cookie" not in right.headers
    elsewhere = sign_in(url, KEY, source="203.0.113.7")  # another source is not held back
    assert elsewhere.status_code == 303 and "set-cookie" in elsewhere.headers
    assert wait_for(lambda: sign_in(url, KEY).status_code == 303, 30)  # once the door opens
    assert "wait" not in sign_in(url, "nope").text  # a sign-in forgets the failures


def test_the_delay_doubles_up_to_its_cap(served: tuple[str, LoginThrottle]) -> None:
    url, throttle = served
    now = [1000.0]
    throttle.clock = lambda: now[0]
    waits = []
    for _ in range(FREE_FAILURES + 12):
        answer = sign_in(url, "nope", source="198.51.100.9")
        assert answer.status_code == 401
        found = re.search(r"wait (\d+) s", answer.text)
        waits.append(int(found.group(1)) if found else 0)
        if waits[-1]:  # the right key is refused too, until the door opens
            refused = sign_in(url, KEY, source="198.51.100.9")
            assert refused.status_code == 429
            assert refused.headers["Retry-After"] == str(waits[-1])
        now[0] += waits[-1]  # the door opens again exactly then
    assert waits[:FREE_FAILURES] == [0] * FREE_FAILURES
    assert waits[FREE_FAILURES:] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert max(waits) == MAX_DELAY


def test_a_burst_of_wrong_keys_is_answered_429_past_the_free_ones(
    served: tuple[str, LoginThrottle],
) -> None:
    url, throttle = served
    throttle.clock = lambda: 1000.0  # the burst takes no time: the door cannot reopen in it
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: sign_in(url, "guess").status_code, range(60)))
    assert answers.count(401) == FREE_FAILURES + 1  # the one that closed the door
    assert answers.count(429) == 60 - FREE_FAILURES - 1


def test_the_key_in_the_url_signs_no_one_in(served: tuple[str, LoginThrottle]) -> None:
    url, _ = served
    answer = requests.get(f"{url}/operator", params={"key": KEY}, timeout=30)
    assert answer.status_code == 401 and "set-cookie" not in answer.headers
    assert "no longer read from the address" in answer.text
    assert "Service health" not in answer.text


def test_every_answer_carries_the_security_headers(
    served: tuple[str, LoginThrottle], funded: str
) -> None:
    url, _ = served
    session = requests.Session()
    signed = session.post(f"{url}/operator/login", data={"key": KEY}, timeout=30)
    assert signed.status_code == 200 and "Service health" in signed.text
    answers = {
        "page": signed,
        "login page": requests.get(f"{url}/operator", timeout=30),
        "healthz": requests.get(f"{url}/healthz", timeout=30),
        "metrics": requests.get(f"{url}/metrics", timeout=30),
        "api": requests.get(f"{url}/api/eval/batches", timeout=30),
        "missing": requests.get(f"{url}/nothing-here", timeout=30),
    }
    for name, answer in answers.items():
        headers = answer.headers
        assert headers["X-Content-Type-Options"] == "nosniff", name
        assert headers["Referrer-Policy"] == "no-referrer", name
        assert headers["X-Frame-Options"] == "DENY", name
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], name
    for name in ("page", "login page"):
        policy = answers[name].headers["Content-Security-Policy"]
        style = re.search(r"<style>(.*?)</style>", answers[name].text, re.DOTALL)
        assert style is not None
        digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
        assert f"style-src 'sha256-{digest}'" in policy, name  # that stylesheet, no other
        assert "default-src 'none'" in policy and "script-src" not in policy
        assert "unsafe-inline" not in policy and "form-action 'self'" in policy
