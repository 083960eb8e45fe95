"""A client reads its own reports over its own channel, and no one else's, black-box.

Two clients drop batches over the real SFTP endpoint; the real service runs them on the
sandbox forge and writes their reports to the shared `outbox/` (one to
`outbox/undelivered/`: its callback answers 500). Each client then lists and fetches its
own reports and receipts with OpenSSH's `sftp`, paramiko, `lftp` and `curl`, and reaches
nothing of the other's by any path; the HTTP API answers the same bytes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import Receiver, start_receiver, tasks, wait_for
from helpers import finish_issues
from sftp_stack import Stack, close, paramiko_client, running_stack, sftp

from dropbox_eval.sftp import sftp_status
from dropbox_eval.util.webserver import BackgroundServer
from dropbox_eval.web.api import create_api


@dataclass
class World:
    """The stack, and each client's finished batch ids (`undelivered`: acme's callback)."""

    stack: Stack
    batches: dict[str, str]
    undelivered: str
    running: str
    lines: str  # other's batch dropped as JSON Lines: its report has a `.jsonl` twin

    def report(self, batch_id: str, folder: str = "") -> Path:
        return self.stack.home / "outbox" / folder / f"{batch_id}.json"


def _upload(stack: Stack, client: str, name: str, **extra: Any) -> str:
    """Drop a one-task batch over SFTP (as JSON Lines for a `.jsonl` name); its batch id
    from the receipt."""
    batch = {"client_id": client, "batch_ref": name.rsplit(".", 1)[0], **extra}
    if name.endswith(".jsonl"):
        body = "\n".join(json.dumps(line) for line in [{"batch": batch}, *tasks(1)])
    else:
        body = json.dumps({**batch, "tasks": tasks(1)})
    session = paramiko_client(stack, user=client, key=client)
    try:
        with session.open(name, "wb") as handle:
            handle.write(body.encode())
    finally:
        close(session)
    receipt = stack.folder(client) / "accepted" / f"{name}.receipt.json"
    assert wait_for(receipt.exists, 30), f"no receipt for {client}/{name}"
    return str(json.loads(receipt.read_text())["batch_id"])


def _finish(stack: Stack, batch_id: str) -> None:
    """The lane closes the batch's issues once they are all open: the receipt comes before
    they are made, and a lane finishing them at once would find none yet."""
    store = stack.app.store
    assert wait_for(lambda: None not in store.issue_numbers(batch_id).values(), 60)
    finish_issues(stack.forge, store.get_batch(batch_id).repo)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    receiver, server = start_receiver()
    receiver.answers.extend([500] * 50)
    try:
        with running_stack(
            tmp_path_factory.mktemp("reports-home"),
            ("acme", "other"),
            quiet_period=600.0,
            poll_interval=0.3,
            settle_seconds=0,
            task_price=0,
            callback_allow="127.0.0.1",
            delivery_retry_base=600,
        ) as stack:
            yield _finished_world(stack, receiver)
    finally:
        server.shutdown()
        server.server_close()


def _finished_world(stack: Stack, receiver: Receiver) -> World:
    batches = {client: _upload(stack, client, f"{client}.json") for client in ("acme", "other")}
    undelivered = _upload(stack, "acme", "hook.json", callback_url=receiver.url)
    running = _upload(stack, "acme", "still.json")
    lines = _upload(stack, "other", "lines.jsonl")
    for batch_id in (*batches.values(), undelivered, lines):
        _finish(stack, batch_id)
    world = World(stack, batches, undelivered, running, lines)
    assert wait_for(lambda: all(world.report(b).exists() for b in [*batches.values(), lines]), 60)
    assert wait_for(lambda: world.report(undelivered, "undelivered").exists(), 60)
    return world


# -- each client sees its own, and nothing of the other's ---------------------------------------


@pytest.mark.parametrize(("me", "them"), [("acme", "other"), ("other", "acme")])
def test_each_client_lists_and_fetches_its_own_reports_and_receipts(
    world: World, me: str, them: str, tmp_path: Path
) -> None:
    mine, theirs = world.batches[me], world.batches[them]
    commands = [
        "ls -1 reports",
        "ls -1 reports/undelivered",
        "ls -1 accepted",
        f"get reports/{mine}.json",
        f"get accepted/{me}.json.receipt.json",
    ]
    if me == "acme":
        commands.append(f"get reports/undelivered/{world.undelivered}.json undelivered.json")
    done = sftp(world.stack, "\n".join(commands) + "\n", user=me, key=me, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = done.stdout
    assert f"{mine}.json" in listed and "undelivered" in listed
    assert theirs not in listed and f"{them}.json" not in listed
    assert world.running not in listed  # a running batch has no report yet
    assert (tmp_path / f"{mine}.json").read_bytes() == world.report(mine).read_bytes()
    receipt = json.loads((tmp_path / f"{me}.json.receipt.json").read_text())
    assert receipt["batch_id"] == mine and receipt["client_id"] == me
    if me == "acme":
        kept = world.report(world.undelivered, "undelivered").read_bytes()
        assert (tmp_path / "undelivered.json").read_bytes() == kept
        assert f"{world.undelivered}.json" in listed
    else:
        assert world.undelivered not in listed


def test_a_json_lines_batch_has_its_jsonl_report_in_the_view_too(
    world: World, tmp_path: Path
) -> None:
    lines, plain = world.lines, world.batches["other"]
    client = paramiko_client(world.stack, user="other", key="other")
    try:
        names = client.listdir("reports")
        with client.open(f"reports/{lines}.jsonl", "rb") as handle:
            fetched = handle.read()
    finally:
        close(client)
    assert {f"{lines}.json", f"{lines}.jsonl", f"{plain}.json"} <= set(names)
    assert f"{plain}.jsonl" not in names  # a JSON batch's report has no twin
    assert fetched == world.report(lines).with_suffix(".jsonl").read_bytes()
    done = sftp(
        world.stack, f"get reports/{lines}.jsonl got\n", user="acme", key="acme", cwd=tmp_path
    )
    assert done.returncode != 0 and not (tmp_path / "got").exists()  # not acme's


def _paths_to(world: World, them: str) -> list[str]:
    """Every way a client might name the other client's report or receipt."""
    theirs, hook = world.batches[them], world.undelivered
    return [
        f"reports/{theirs}.json",
        f"/reports/{theirs}.json",
        f"reports//./{theirs}.json",
        f"reports/undelivered/{theirs}.json",
        f"reports/undelivered/{hook}.json" if them == "acme" else f"reports/{hook}.json",
        f"Reports/{theirs}.json",
        f"reports/../reports/{theirs}.json",
        f"../outbox/{theirs}.json",
        f"/outbox/{theirs}.json",
        f"outbox/{theirs}.json",
        f"../../outbox/{theirs}.json",
        f"reports/undelivered/../{theirs}.json",
        f"accepted/{them}.json.receipt.json",
        f"../{them}/accepted/{them}.json.receipt.json",
        f"/{them}/accepted/{them}.json.receipt.json",
        f"reports/{them}/accepted/{them}.json.receipt.json",
    ]


@pytest.mark.parametrize(("me", "them"), [("acme", "other"), ("other", "acme")])
def test_no_path_reaches_the_other_clients_reports_or_receipts(
    world: World, me: str, them: str, tmp_path: Path
) -> None:
    for path in _paths_to(world, them):
        done = sftp(world.stack, f"get {path} got.json\n", user=me, key=me, cwd=tmp_path)
        assert done.returncode != 0, path
        assert not (tmp_path / "got.json").exists(), path
    client = paramiko_client(world.stack, user=me, key=me)
    try:
        for path in _paths_to(world, them):
            with pytest.raises(OSError):
                client.stat(path)
            with pytest.raises(OSError):
                client.open(path, "rb").read()
        for folder in ("reports", "reports/undelivered", "accepted"):
            names = client.listdir(folder)
            assert not any(world.batches[them] in n or n.startswith(them) for n in names)
    finally:
        close(client)


def test_the_reports_view_is_read_only(world: World, tmp_path: Path) -> None:
    mine = world.batches["acme"]
    before = world.report(mine).read_bytes()
    (tmp_path / "x.json").write_text("{}")
    for command in (
        "put x.json reports/x.json",
        f"put x.json reports/{mine}.json",
        f"rm reports/{mine}.json",
        f"rename reports/{mine}.json mine.json",
        "mkdir reports/sub",
        "rmdir reports/undelivered",
    ):
        done = sftp(world.stack, f"{command}\n", cwd=tmp_path)
        assert done.returncode != 0, command
    assert world.report(mine).read_bytes() == before
    assert not (world.stack.home / "outbox" / "x.json").exists()


# -- the README's ways to fetch a report: lftp, curl (SFTP and HTTPS API) -----------------------


def _ssh_command(world: World, client: str) -> str:
    stack = world.stack
    return (
        f"ssh -a -x -F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes "
        f"-o UserKnownHostsFile={stack.known_hosts} -o StrictHostKeyChecking=yes "
        f"-i {stack.keys[client]}"
    )


def test_lftp_fetches_a_report(world: World, tmp_path: Path) -> None:
    mine = world.batches["acme"]
    script = (
        f"set sftp:connect-program '{_ssh_command(world, 'acme')}'; "
        f"cls -1 reports/; get reports/{mine}.json -o {tmp_path}/lftp.json; bye"
    )
    done = subprocess.run(
        ["lftp", "-e", script, f"sftp://acme:@127.0.0.1:{world.stack.port}"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert f"{mine}.json" in done.stdout and world.batches["other"] not in done.stdout
    assert (tmp_path / "lftp.json").read_bytes() == world.report(mine).read_bytes()


def test_curl_fetches_a_report_over_sftp(world: World, tmp_path: Path) -> None:
    stack, mine = world.stack, world.batches["acme"]
    # the fingerprint the endpoint printed at start, as given to clients, without `SHA256:`
    pinned = str(sftp_status(stack.home / "state")["host_key"]).removeprefix("SHA256:")
    base = ["curl", "--silent", "--show-error", "--user", "acme:"]
    base += ["--key", str(stack.keys["acme"]), "--pubkey", f"{stack.keys['acme']}.pub"]
    base += ["--hostpubsha256", pinned]
    url = f"sftp://127.0.0.1:{stack.port}/reports"
    got = subprocess.run(
        [*base, "-o", str(tmp_path / "curl.json"), f"{url}/{mine}.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "curl.json").read_bytes() == world.report(mine).read_bytes()
    theirs = world.batches["other"]
    refused = subprocess.run(
        [*base, "-o", str(tmp_path / "no.json"), f"{url}/{theirs}.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and not (tmp_path / "no.json").exists()


def test_the_api_answers_the_same_bytes_to_the_batch_own_client_only(
    world: World, tmp_path: Path
) -> None:
    app = world.stack.app
    keys = {client: app.billing.new_api_key(client) for client in ("acme", "other")}
    server = BackgroundServer(create_api(app.web), name="api")
    url = server.start()
    try:
        mine = world.batches["acme"]
        answer = subprocess.run(
            ["curl", "--silent", "--show-error", "--fail", "-o", str(tmp_path / "api.json")]
            + ["-H", f"Authorization: Bearer {keys['acme']}"]
            + [f"{url}/api/eval/batches/{mine}/report"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.returncode == 0, answer.stderr
        assert (tmp_path / "api.json").read_bytes() == world.report(mine).read_bytes()

        def report(batch_id: str, client: str) -> requests.Response:
            headers = {"Authorization": f"Bearer {keys[client]}"}
            return requests.get(
                f"{url}/api/eval/batches/{batch_id}/report", headers=headers, timeout=10
            )

        kept = report(world.undelivered, "acme")
        assert kept.status_code == 200
        assert kept.content == world.report(world.undelivered, "undelivered").read_bytes()
        assert kept.headers["content-type"] == "application/json"
        stranger = report(mine, "other")  # exactly like a batch that does not exist
        assert stranger.status_code == 404 and stranger.json()["reason"] == "not_found"
        assert report("20260101-000000-nothere0", "other").json() == stranger.json() | {
            "message": "no batch '20260101-000000-nothere0'"
        }
        running = report(world.running, "acme")
        assert running.status_code == 409 and running.json()["reason"] == "not_finished"
        anonymous = requests.get(f"{url}/api/eval/batches/{mine}/report", timeout=10)
        assert anonymous.status_code == 401
    finally:
        server.stop()


def test_a_paramiko_session_sees_the_same_view(world: World) -> None:
    client = paramiko_client(world.stack)
    try:
        top = client.listdir("/")
        assert "reports" in top and "accepted" in top
        assert client.listdir("reports/undelivered") == [f"{world.undelivered}.json"]
        with client.open(f"reports/{world.batches['acme']}.json", "rb") as handle:
            assert handle.read() == world.report(world.batches["acme"]).read_bytes()
    finally:
        close(client)
