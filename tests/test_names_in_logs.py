"""Names from clients reach no log line raw (a name must not forge a log line), and stale
uploads go.

The real command line in a subprocess (`dropbox-eval run --once --sandbox`), in both log
formats, over a real inbox: a dropped file whose name carries a newline, a terminal escape
or a bidi override is rejected (`invalid_name`), and every line the service writes is one
record.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import unicodedata
from pathlib import Path

import forkrun
import pytest
from conftest import read_json, tasks

from dropbox_eval.app import build_app
from dropbox_eval.config import load_settings
from dropbox_eval.util.printable import printable, unprintable_reason

FORGED = "2026-12-01 00:00:00,000 INFO batch b1: report emitted to outbox"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ |^  ")
UNSAFE_CATEGORIES = ("Cc", "Cs", "Zl", "Zp")  # control, surrogate, line and paragraph separators
HOSTILE = {
    "acme": f"evil\n{FORGED}.json",
    "acme/": "esc\x1b]0;pwned\x07\x1b[2J.json",
    "": "right-to-left\u202enosj.exe.json",
}


def run_once(home: Path, log_format: str, **env: str) -> forkrun.Finished:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SAAS_EVAL_", "SANDBOX_"))}
    clean |= {"SAAS_EVAL_HOME": str(home), "SAAS_EVAL_QUIET_PERIOD": "0.1", **env}
    clean["SAAS_EVAL_LOG_FORMAT"] = log_format
    return forkrun.run(["run", "--once", "--sandbox"], clean, 120)


def drop_hostile_names(home: Path) -> list[Path]:
    build_app(load_settings(home=home), with_forge=False).billing.add_client("acme", 10)
    body = json.dumps({"client_id": "acme", "tasks": tasks(1)})
    dropped = []
    for folder, name in HOSTILE.items():
        path = home / "inbox" / folder.rstrip("/") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        dropped.append(path)
    return dropped


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_names_with_control_characters_are_rejected_and_logged_escaped(
    tmp_path: Path, log_format: str
) -> None:
    dropped = drop_hostile_names(tmp_path)
    done = run_once(tmp_path, log_format)
    assert done.returncode == 0, done.stderr[-2000:]
    for path in dropped:
        error = read_json(path.parent / "rejected" / f"{path.name}.error.json")
        assert error["reason"] == "invalid_name" and "control character" in error["message"]
        assert not path.exists()
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "\u202e" not in done.stderr
    lines = done.stderr.splitlines()
    if log_format == "json":
        messages = [json.loads(line)["message"] for line in lines]  # every line is a record
        assert not any(c in m for m in messages for c in "\n\x1b\x07\u202e")
    else:
        assert all(TEXT_LINE.match(line) for line in lines), lines
        messages = lines
    assert not any(line.startswith(FORGED) for line in lines)
    shown = "evil\\n" + FORGED
    assert any(shown in message and "invalid_name" in message for message in messages)
    assert any("\\u202e" in message for message in messages)


def test_run_once_sweeps_stale_uploads_and_keeps_fresh_ones(tmp_path: Path) -> None:
    build_app(load_settings(home=tmp_path), with_forge=False)  # `run --once` needs a state
    folder = tmp_path / "inbox" / "acme"
    folder.mkdir(parents=True)
    stale = [folder / "old.json.part", folder / ".old.json.Xy12Ab", tmp_path / "inbox" / "x.tmp"]
    for path in stale:
        path.write_text("{")
    time.sleep(2.5)
    fresh = folder / "new.json.part"
    fresh.write_text("{")
    stop = threading.Event()

    def keep_touching() -> None:  # `put -p` style: an old mtime, but the file keeps changing
        while not stop.wait(0.2):
            os.utime(fresh, (0, 0))

    toucher = threading.Thread(target=keep_touching)
    toucher.start()
    try:
        done = run_once(tmp_path, "text", SAAS_EVAL_STALE_UPLOAD_SECONDS="2")
    finally:
        stop.set()
        toucher.join()
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any(path.exists() for path in stale) and fresh.exists()
    for shown in ("acme/old.json.part", "acme/.old.json.Xy12Ab", "x.tmp"):
        assert f"inbox: removed {shown}: a temporary upload never renamed" in done.stderr


def test_the_escape_rule_covers_every_control_separator_surrogate_and_bidi_character() -> None:
    wanted = {c for c in range(0x110000) if unicodedata.category(chr(c)) in UNSAFE_CATEGORIES}
    wanted |= {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
    escaped = {c for c in range(0x110000) if printable(chr(c)) != chr(c)}
    assert escaped == wanted
    assert all(unprintable_reason(f"a{chr(c)}.json") for c in wanted)
    assert printable("tab\there\r\n\x1b[2J\u202e") == "tab\\there\\r\\n\\x1b[2J\\u202e"
    assert unprintable_reason("plain name é-ü.json") is None
