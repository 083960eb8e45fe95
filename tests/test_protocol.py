"""The file protocol's pure decisions (`protocol/`): which inbox names count, how a batch's
bytes are parsed and checked, and which callback URLs are refused; no service, no forge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import tasks

from dropbox_eval.errors import BatchRejected
from dropbox_eval.protocol.batchfile import check_claims, parse_batch, window_of
from dropbox_eval.protocol.callbacks import CallbackPolicy
from dropbox_eval.protocol.namefilter import NAMES, NameKind

LIMITS = {"max_bytes": 10_000, "max_tasks": 5}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nightly.json", NameKind.CANDIDATE),
        ("NIGHTLY.JSON", NameKind.CANDIDATE),
        ("nightly.json.part", NameKind.TEMPORARY),
        ("nightly.json.filepart", NameKind.TEMPORARY),
        (".nightly.json.AbC123", NameKind.HIDDEN),
        (".in.nightly.json", NameKind.HIDDEN),
        ("notes.txt", NameKind.OTHER),
        ("nightly.json.lftp", NameKind.OTHER),
        ("..", NameKind.OTHER),
        ("a/b.json", NameKind.OTHER),
    ],
)
def test_each_name_has_one_kind(name: str, kind: NameKind) -> None:
    assert NAMES.kind(name) is kind
    assert NAMES.is_upload(name) is (kind is not NameKind.OTHER)


def test_a_candidate_sits_at_the_top_or_in_one_client_folder(tmp_path: Path) -> None:
    assert NAMES.is_candidate(tmp_path, tmp_path / "a.json")
    assert NAMES.is_candidate(tmp_path, tmp_path / "acme" / "a.json")
    assert not NAMES.is_candidate(tmp_path, tmp_path / "acme" / "deeper" / "a.json")
    assert not NAMES.is_candidate(tmp_path, tmp_path / "Accepted" / "a.json")  # reserved
    assert not NAMES.is_candidate(tmp_path, tmp_path / ".hidden" / "a.json")
    assert not NAMES.is_candidate(tmp_path, tmp_path.parent / "a.json")


def _raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def _reason(raw: bytes) -> tuple[str, Any]:
    with pytest.raises(BatchRejected) as refused:
        parse_batch(raw, **LIMITS)
    return refused.value.reason, refused.value.details.get("field")


def test_a_batch_is_parsed_once_and_refused_in_words_a_client_can_act_on() -> None:
    batch = parse_batch(_raw({"client_id": "acme", "tasks": tasks(2)}), **LIMITS)
    assert [t.task_id for t in batch.tasks] == ["t1", "t2"] and batch.client_id == "acme"
    assert _reason(b"   ") == ("invalid_json", None)
    assert _reason(b'{"tasks": [1, }') == ("invalid_json", None)
    assert _reason('{"tasks": []}'.encode("utf-16")) == ("invalid_encoding", None)
    assert _reason(b'{"tasks": [], "tasks": []}')[0] == "invalid_json"  # duplicate keys
    assert _reason(b'{"tasks": [], "n": NaN}')[0] == "invalid_json"
    assert _reason(b"[1, 2]") == ("invalid_batch", "(document)")
    assert _reason(_raw({"tasks": tasks(6)})) == ("too_many_tasks", "tasks")
    assert _reason(b" " * 10_001)[0] == "too_large"
    assert _reason(_raw({"tasks": [{"task_id": "a/b", "title": "x"}]})) == (
        "invalid_batch",
        "tasks.0.task_id",
    )


def test_the_claims_of_a_parsed_batch() -> None:
    batch = parse_batch(_raw({"client_id": "acme", "tasks": tasks(3)}), **LIMITS)
    check_claims(batch, "acme", 3)
    with pytest.raises(BatchRejected) as other:
        check_claims(batch, "globex", 3)
    assert other.value.reason == "client_mismatch"
    with pytest.raises(BatchRejected) as many:
        check_claims(batch, "acme", 2)
    assert many.value.reason == "too_many_tasks"
    reserved = parse_batch(_raw({"client_id": "rejected", "tasks": tasks(1)}), **LIMITS)
    with pytest.raises(BatchRejected) as folder:
        check_claims(reserved, "rejected", 3)
    assert folder.value.reason == "reserved_client_id"


def test_the_completion_window_is_the_batch_s_own_within_bounds() -> None:
    plain = parse_batch(_raw({"tasks": tasks(1)}), **LIMITS)
    assert window_of(plain, 3600, 86_400) == 3600
    own = parse_batch(_raw({"tasks": tasks(1), "completion_window": "2h"}), **LIMITS)
    assert window_of(own, 3600, 86_400) == 7200
    with pytest.raises(BatchRejected) as long:
        window_of(own, 3600, 3600)
    assert long.value.details["field"] == "completion_window"


def _resolver(addresses: dict[str, list[str]]) -> Any:
    return lambda host, port: addresses[host]


def test_a_callback_reaches_public_or_allowed_addresses_only() -> None:
    names = {"hooks.example": ["93.184.216.34"], "inside.example": ["10.0.0.5"]}
    policy = CallbackPolicy(resolver=_resolver(names))
    target = policy.check("https://hooks.example/cb?x=1")
    assert (target.host, target.port, [str(a) for a in target.addresses]) == (
        "hooks.example",
        443,
        ["93.184.216.34"],
    )
    for url in (
        "https://inside.example/cb",  # a name resolving inside
        "http://127.0.0.1/cb",
        "http://[::ffff:10.0.0.1]/cb",  # an IPv4 inside an IPv6 address
        "http://169.254.169.254/latest",  # cloud metadata
        "ftp://hooks.example/cb",
        "https://user@hooks.example/cb",
    ):
        with pytest.raises(BatchRejected) as refused:
            policy.check(url)
        assert refused.value.reason == "callback_refused", url
    allowed = CallbackPolicy("10.0.0.0/8, intranet", resolver=_resolver(names))
    assert [str(a) for a in allowed.check("https://inside.example/cb").addresses] == ["10.0.0.5"]
