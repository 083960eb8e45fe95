"""A repo renamed or transferred on the forge: its batches follow it.

The forge client remembers every move the forge told it (a redirect from the old path;
the scout lists a repo by its stored name when the search finds its batch's issues under
another name, to hear it). Before a visit the batches of a moved repo are rewritten under
its new full name (the record, then its index row), so the listing, the search's match, the
webhooks' repo check and every later write use it; until then the old name still works
through the forge's redirect.
"""

from __future__ import annotations

import logging

from ..forge.client import GiteaClient
from ..models import BatchRecord
from ..store import Store

log = logging.getLogger("dropbox_eval")


def follow_moves(store: Store, gitea: GiteaClient, batches: list[BatchRecord]) -> list[BatchRecord]:
    """`batches`, each one whose repo moved stored and returned under the new name."""
    followed = []
    for batch in batches:
        moved = gitea.moved(batch.repo)
        if moved is None:
            followed.append(batch)
            continue
        log.warning(
            "batch %s: repo %s is now %s on the forge (renamed or transferred); following it",
            batch.batch_id,
            batch.repo,
            moved,
        )
        followed.append(store.update_batch(batch.batch_id, repo=moved))
    return followed
