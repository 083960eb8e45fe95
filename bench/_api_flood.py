"""The API door for bench/inbox_fairness.py: client B's one-task `POST /api/eval/batches`
while client A's posts flood the API, each flood sent by a process of its own (so its
threads do not share the service's interpreter lock).

A flooding client is a well-behaved one: each of its posts is sent once, and again after
`Retry-After` whenever the door answers 429 or 503. `python bench/_api_flood.py URL KEY N`
runs one flood and prints `{"posts": N, "refused": R, "seconds": S}`.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from _common import make_tasks

PATH = "/api/eval/batches"


def post(url: str, key: str, document: dict[str, Any]) -> tuple[int, str | None, bytes]:
    """One POST of `document`: its status, its `Retry-After` and its body."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=120)
    try:
        body = json.dumps(document).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        connection.request("POST", PATH, body, headers)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Retry-After"), answer.read()
    finally:
        connection.close()


def post_until_taken(url: str, key: str, document: dict[str, Any]) -> int:
    """Post until the batch is taken (201 or 200); how many times it was refused."""
    refused = 0
    while True:
        status, retry_after, body = post(url, key, document)
        if status in (200, 201):
            return refused
        if status not in (429, 503):
            raise RuntimeError(f"POST answered {status}: {body[:200]!r}")
        refused += 1
        time.sleep(float(retry_after or 1))


def flood(url: str, key: str, count: int) -> dict[str, Any]:
    """`count` one-task posts, all sent at once (one thread each)."""
    started = time.perf_counter()
    documents = [{"tasks": make_tasks(1, f"f{index}-")} for index in range(count)]
    with ThreadPoolExecutor(count) as pool:
        refused = sum(pool.map(lambda document: post_until_taken(url, key, document), documents))
    return {"posts": count, "refused": refused, "seconds": time.perf_counter() - started}


def start_flood(url: str, key: str, count: int) -> subprocess.Popen[str]:
    """A flood of `count` posts in a process of its own (its result on stdout)."""
    return subprocess.Popen(
        [sys.executable, __file__, url, key, str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )


def flood_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    """What a flood process printed, once it has ended."""
    out, _ = process.communicate(timeout=600)
    if process.returncode:
        raise RuntimeError(f"the API flood failed (exit {process.returncode})")
    found: dict[str, Any] = json.loads(out)
    return found


if __name__ == "__main__":
    print(json.dumps(flood(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
