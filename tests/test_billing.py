"""Credits (`billing/`): a batch holds its cost, pays for its finished tasks only and releases
the whole hold; accounts, keys and secrets. On a real store in a tmp folder, no forge."""

from __future__ import annotations

from pathlib import Path

import pytest

from dropbox_eval.billing.accounts import Billing, hash_api_key
from dropbox_eval.errors import BatchRejected, DropboxEvalError, InvalidArgument, NotFoundError
from dropbox_eval.models import LedgerEntry
from dropbox_eval.store.engine import TinyDBStore


@pytest.fixture
def billing(tmp_path: Path) -> Billing:
    """Tasks at 2 credits; `acme` has 10."""
    made = Billing(TinyDBStore(tmp_path), 2)
    made.add_client("acme", 10)
    return made


def _post(billing: Billing, entries: list[LedgerEntry]) -> None:
    with billing.store.transaction() as tx:
        for entry in entries:
            tx.post_ledger(entry)


def _money(billing: Billing) -> tuple[int, int, int]:
    client = billing.client("acme")
    return client.balance, client.held, client.available


def test_a_batch_holds_its_cost_and_pays_for_finished_tasks_only(billing: Billing) -> None:
    cost = billing.check_funded("acme", 4)
    assert cost == 8
    hold = billing.hold_entry("acme", cost, "b1")
    assert hold is not None
    _post(billing, [hold])
    assert _money(billing) == (10, 8, 2)  # held, not spent
    with pytest.raises(BatchRejected) as unfunded:
        billing.check_funded("acme", 2)  # 4 credits; 2 available
    assert unfunded.value.reason == "unfunded"
    assert {k: unfunded.value.details[k] for k in ("cost", "balance", "available")} == {
        "cost": 4,
        "balance": 10,
        "available": 2,
    }
    final = billing.final_charge("acme", "b1", hold=8, charged=6)  # 3 of 4 tasks ended
    assert [(e.kind, e.amount, e.held_change) for e in final] == [
        ("charge", -6, 0),
        ("release", 0, -8),
    ]
    _post(billing, final)
    assert _money(billing) == (4, 0, 4)
    ledger = billing.store.ledger("acme")
    assert [(e.kind, e.balance_after, e.held_after) for e in ledger] == [
        ("fund", 10, 0),
        ("hold", 10, 8),
        ("charge", 4, 8),
        ("release", 4, 0),
    ]
    assert sum(e.amount for e in ledger) == 4 and sum(e.held_change for e in ledger) == 0


def test_a_free_batch_moves_no_money(tmp_path: Path) -> None:
    free = Billing(TinyDBStore(tmp_path), 0)
    free.add_client("acme")
    assert free.check_funded("acme", 50) == 0
    assert free.hold_entry("acme", 0, "b1") is None
    assert free.final_charge("acme", "b1", hold=0, charged=0) == []
    with pytest.raises(BatchRejected) as unknown:
        free.check_funded("ghost", 1)
    assert unknown.value.reason == "unknown_client"


def test_a_batch_that_ran_nothing_is_released_without_a_charge(billing: Billing) -> None:
    assert [e.kind for e in billing.final_charge("acme", "b1", hold=8, charged=0)] == ["release"]


def test_accounts_refuse_bad_ids_twice_made_clients_and_bad_amounts(billing: Billing) -> None:
    for bad in ("a b", "../x", "accepted"):
        with pytest.raises(InvalidArgument):
            billing.add_client(bad)
    with pytest.raises(DropboxEvalError, match="already exists"):
        billing.add_client("acme")
    with pytest.raises(InvalidArgument):
        billing.fund("acme", 0)
    with pytest.raises(NotFoundError):
        billing.fund("ghost", 5)
    assert billing.fund("acme", 5).balance == 15


def test_keys_are_kept_as_hashes_and_secrets_rotate(billing: Billing) -> None:
    key = billing.new_api_key("acme")
    client = billing.client("acme")
    stored = [k.sha256 for k in client.api_keys]
    assert key not in stored and hash_api_key(key) in stored
    assert billing.client_for_key(key) == client
    assert billing.client_for_key(key + "x") is None
    old = client.webhook_secret
    new = billing.rotate_secret("acme")
    assert new.startswith("whsec_") and new != old
    assert billing.client("acme").webhook_secret == new
