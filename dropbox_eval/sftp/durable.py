"""How a completed upload becomes durable before its client hears so, with the folder's fsync
shared by the uploads completed at the same time (group commit).

An upload is written to a hidden name (`.sftp-<random>.<name>.tmp`, never read by the
service and removed by the sweep at the endpoint's start), hashed as it is written. When
the client closes it:

1. fdatasync the hidden file: its bytes (and its size) are on disk under the hidden name.
   For a small upload this begins at its first write (upload.py); the close waits for it
   and syncs again if anything was written after it began, so step 1 still ends, covering
   every write, before step 2 begins;
2. rename it to its name (one atomic rename(2)): the service may read it from now on;
3. fsync the client folder, once for every rename made into it before that fsync began;
4. answer the close: OK.

What a crash (process or power) at each point leaves, and why nothing is lost or
duplicated:

- before 1 ends: at most the hidden file, swept at the next start; the client never had
  an OK, so its tool reports the upload as failed and it uploads again: one batch.
- after 1, before 2: the same (the data is durable, but only under the hidden name).
- after 2, before 3 ends: the rename may or may not have reached the disk. If not, this
  is the case above. If it has, the drop's name holds the whole file (its bytes were made
  durable in 1, so never an empty or partial file), and the service makes it a batch;
  the client, with no OK, may upload it again, and the service refuses the second copy as
  a duplicate of the first (same sha256): one batch, no second set of issues.
- after 3, before 4: the file is durable in place; the same as above.
- after 4: the batch is the service's; the client was told only now.

Sharing the folder's fsync changes none of this: fsync on a folder makes durable every
change to its entries made before the call, so one fsync that begins after several renames
covers them all, and no close is answered before an fsync that began after its own rename
has ended. A failed fsync fails every close it was to cover (each client uploads again, and
any copy the service already read is refused as a duplicate).

fdatasync suffices in 1: it makes durable the bytes and what reading them back needs (the
size, the blocks), which is all the name promises; the times (`put -p`) are not promised.
An early fdatasync that failed fails its upload at the close: after a failed fsync the
kernel may mark the pages clean, so a later one could succeed without the bytes.

No case allows answering before 3 ends: until then a power loss may undo the rename, and
the hidden file it leaves is swept at the next start (keeping it instead would need a
durable mark that it was complete: a write and a folder fsync of its own). So one session's
uploads, answered one after the other, each wait for two disk flushes: the file's, then
the folder's.
"""

from __future__ import annotations

import asyncio
import os


class FolderSync:
    """Group commit of one folder's fsync: `synced` returns once an fsync of the folder that
    began after the call has ended. Calls that arrive while an fsync runs share the next one."""

    def __init__(self) -> None:
        """One per folder (per client: every session of it renames into the same folder)."""
        self._lock = asyncio.Lock()
        self._requested = 0  # numbers handed to callers, in call order
        self._covered = 0  # every number up to this one is durable (or failed, below)
        self._failed: tuple[int, int, OSError] | None = None  # (after, up to, the error)

    async def synced(self, folder_fd: int) -> None:
        """Make every rename into the folder (`folder_fd`, any descriptor of it) made
        before this call durable; OSError when the fsync that was to cover it failed."""
        self._requested += 1
        mine = self._requested
        async with self._lock:
            if self._failed is not None and self._failed[0] < mine <= self._failed[1]:
                raise self._failed[2]  # a failure sticks: a later fsync may not report it
            if mine <= self._covered:
                return
            after, upto = self._covered, self._requested  # all renamed before the fsync
            try:
                await asyncio.to_thread(os.fsync, folder_fd)
            except OSError as exc:
                self._failed = (after, upto, exc)
                raise
            finally:
                self._covered = upto


class FolderSyncs:
    """The FolderSync of each client folder the endpoint serves."""

    def __init__(self) -> None:
        """Empty: one is made on a client's first upload."""
        self._by_client: dict[str, FolderSync] = {}

    def of(self, client_id: str) -> FolderSync:
        """The group commit of `client_id`'s folder."""
        return self._by_client.setdefault(client_id, FolderSync())
