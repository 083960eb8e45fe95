"""The jailed SFTP server: one client's inbox folder, where an upload completes by close.

The session root is `inbox/<client_id>/`. Paths are virtual: a client path is split into at
most two parts and checked against a fixed shape (the folder, a file in it, `accepted/` and
`rejected/`, a file in one of those); `..` is refused outright, and every
file-system call goes through directory descriptors opened with O_NOFOLLOW, so a symlink on
disk (planted by anyone) is never followed and nothing outside the folder is reachable.

What a client may do:

- write `*.json` files, temporary names (`*.part`, `*.filepart`, ...) and hidden names
  (lftp's `.in.x.json`; namefilter.NAMES is the rule) in its folder; an
  upload is written to a hidden name (`.sftp-<random>.<name>.part`, never a candidate for
  the inbox) and renamed into place when the client closes it, so the service sees one
  atomic rename and reads the file at once; an upload whose session ends before the close
  is removed;
- rename or remove such names in its folder (WinSCP's `.filepart` then rename);
- list and read `accepted/` and `rejected/` (receipts and error files), never write there;
  remove a file of `rejected/` (it counts against the quota until then);
- list and read its own reports in `reports/` and `reports/undelivered/` (reports.py);
  a file is read only when it is a regular file, never through a link (download.py).

Open files are capped per session and per client, and uploads by the client's storage
quota (bounds.py). The event loop serves every session, so what waits on the disk or reads
the state runs in worker threads: listings, a page at a time (listing.py), the reports
view's state (reports.py), an upload's fsyncs (durable.py).

Links (symlink, hardlink), directories, reads of pending files and resumed or appended
uploads (a write that would leave a hole) are refused.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncssh
from asyncssh import (
    FXF_WRITE,
    SFTPAttrs,
    SFTPFailure,
    SFTPFileAlreadyExists,
    SFTPName,
    SFTPNoSuchFile,
    SFTPPermissionDenied,
    SFTPQuotaExceeded,
)

from . import download, upload
from .bounds import REJECTED, OpenFilesLimit, SessionBounds, remove_rejected
from .download import Download, open_regular
from .durable import FolderSync
from .listing import Listing, group_name, user_name
from .paths import (
    DIR_FLAGS,
    FixedShape,
    Target,
    open_client_folder,
    parse_path,
    stat_at,
    visible,
    writable_name,
)
from .reports import FOLDERS as REPORT_FOLDERS
from .reports import ReportsView
from .upload import FileReport


class JailedSFTPServer(FixedShape, asyncssh.SFTPServer):
    """SFTP over one client's inbox folder (see the module docstring)."""

    def __init__(
        self,
        chan: asyncssh.SSHServerChannel[bytes],
        folder: Path,
        max_bytes: int,
        report: FileReport,
        *,
        bounds: SessionBounds,
        reports: ReportsView,
        folder_sync: FolderSync,
        may_upload: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`folder` is `inbox/<client_id>` (created if missing, never through a symlink);
        `folder_sync` its group commit, shared by the client's sessions; `may_upload` why
        the session may no longer upload (its key revoked, its client disabled), asked at
        each upload's start, so a session outlives neither."""
        super().__init__(chan)
        self._max_bytes = max_bytes
        self._report = report
        self._bounds = bounds
        self._reports = reports
        self._folder_sync = folder_sync
        self._may_upload = may_upload
        self._root = open_client_folder(folder)
        self._listing = Listing(self._folder_fd, self.format_longname)

    # -- paths --------------------------------------------------------------------------

    def map_path(self, path: bytes) -> bytes:
        """Never used: every operation below resolves paths itself."""
        raise SFTPPermissionDenied("not available")

    def realpath(self, path: bytes) -> bytes:
        """The canonical virtual path (no file-system access)."""
        return f"/{parse_path(path)}".encode()

    def _folder_fd(self, folder: str | None) -> int:
        """A new descriptor of the folder a path names (the caller closes it)."""
        if folder is None:
            return os.dup(self._root)
        if folder in REPORT_FOLDERS:
            return self._reports.folder_fd(folder)
        try:
            return os.open(folder, DIR_FLAGS, dir_fd=self._root)
        except OSError:
            raise SFTPNoSuchFile(f"{folder}/ does not exist yet") from None

    async def _find(self, folder_fd: int, target: Target) -> os.stat_result | None:
        """The attributes of a visible file of an open folder; None for anything else."""
        assert target.name is not None
        if target.folder in REPORT_FOLDERS:
            return await self._reports.find(folder_fd, target.name)
        info = stat_at(folder_fd, target.name)
        return info if info is not None and visible(info, target) else None

    # -- attributes and listings --------------------------------------------------------

    async def lstat(self, path: bytes) -> os.stat_result:
        """Attributes of a visible entry; anything else does not exist."""
        target = parse_path(path)
        if target.name is None and target.folder in REPORT_FOLDERS:
            return os.fstat(self._root)  # the view's folders exist even before a report
        fd = self._folder_fd(target.folder)
        try:
            info = os.fstat(fd) if target.name is None else await self._find(fd, target)
        finally:
            os.close(fd)
        if info is None:
            raise SFTPNoSuchFile("no such file")
        return info

    async def stat(self, path: bytes) -> os.stat_result:
        """Same as lstat: links are never followed."""
        return await self.lstat(path)

    async def scandir(self, path: bytes) -> AsyncIterator[SFTPName]:
        """The visible entries of a folder of the view, a page at a time (listing.py),
        with the view's own folders: `reports/` at the top, `undelivered/` in it."""
        folder = parse_path(path)
        if folder.name is not None:
            raise SFTPNoSuchFile("not a folder")
        if folder.folder == REPORT_FOLDERS[0]:
            yield self._listing.folder_entry(
                REPORT_FOLDERS[1].rpartition("/")[2], os.fstat(self._root)
            )
        if folder.folder in REPORT_FOLDERS:
            names = await self._reports.names()
        else:
            names = await self._listing.folder_names(folder.folder)
        async for page in self._listing.pages(folder.folder, names):
            for entry in page:
                yield entry
        if folder.folder is None:
            yield self._listing.folder_entry(REPORT_FOLDERS[0], os.fstat(self._root))

    def format_user(self, uid: int | None) -> str:
        """The `ls -l` owner name, looked up once per uid (listing.py)."""
        return user_name(uid)

    def format_group(self, gid: int | None) -> str:
        """The `ls -l` group name, looked up once per gid (listing.py)."""
        return group_name(gid)

    def statvfs(self, path: bytes) -> os.statvfs_result:
        """Free space of the client folder's file system."""
        parse_path(path)
        return os.statvfs(self._root)

    # -- files ----------------------------------------------------------------------------

    async def open(self, path: bytes, pflags: int, attrs: SFTPAttrs) -> upload.Upload | Download:
        """Start an upload, or open a receipt, error file or report for reading; either
        takes one of the session's and the client's open-file slots (bounds.py)."""
        target = parse_path(path)
        try:
            self._bounds.open_file()
        except OpenFilesLimit as exc:
            self._report(str(target), 0, f"refused ({exc.reason})", None)
            raise
        try:
            if pflags & FXF_WRITE:
                self._refuse_if_revoked(target)
                return upload.start(self._root, target, pflags, self._bounds)
            return await self._open_readable(target)
        except SFTPQuotaExceeded as exc:
            self._bounds.close_file()
            self._report(str(target), 0, f"refused ({exc.reason})", None)
            raise
        except BaseException:
            self._bounds.close_file()
            raise

    def _refuse_if_revoked(self, target: Target) -> None:
        refusal = self._may_upload()
        if refusal is not None:
            self._report(str(target), 0, f"refused ({refusal})", None)
            raise SFTPPermissionDenied(refusal)

    async def _open_readable(self, target: Target) -> Download:
        if target.folder is None or target.name is None:
            raise SFTPPermissionDenied(
                "only files in accepted/, rejected/ and reports/ can be read"
            )
        folder = self._folder_fd(target.folder)
        try:
            if await self._find(folder, target) is None:
                raise SFTPNoSuchFile("no such file")
            return open_regular(folder, target.name)
        finally:
            os.close(folder)

    def read(self, file_obj: object, offset: int, size: int) -> bytes:
        """Read from a receipt or error file."""
        if not isinstance(file_obj, Download):
            raise SFTPPermissionDenied("uploads cannot be read back")
        return download.read(file_obj, offset, size)

    def write(self, file_obj: object, offset: int, data: bytes) -> int:
        """Write to an upload; past SAAS_EVAL_MAX_FILE_BYTES the upload fails and is removed."""
        if not isinstance(file_obj, upload.Upload):
            raise SFTPPermissionDenied("accepted/, rejected/ and reports/ are read-only")
        written = upload.write(self._root, file_obj, offset, data, self._max_bytes)
        upload.sync_early(file_obj)
        return written

    async def close(self, file_obj: object) -> None:
        """Finish a download; make a complete upload durable in place, then answer
        (durable.py; see `_session_over`)."""
        self._bounds.close_file()
        if isinstance(file_obj, Download):
            os.close(file_obj.fd)
            return
        assert isinstance(file_obj, upload.Upload)
        await upload.close(
            self._root,
            file_obj,
            self._folder_sync,
            self._report,
            by_client=not self._session_over(),
        )

    def _session_over(self) -> bool:
        """Whether this close comes from asyncssh's clean-up of a finished session.

        asyncssh closes every handle left open when the SFTP stream ends (the client sent
        EOF, closed the channel or lost the connection); such an upload was never completed
        by the client, so it is removed instead of renamed into place. A close request the
        client sent on a live channel is the only completion.
        """
        chan = self.channel
        return chan.is_closing() or getattr(chan, "_recv_state", "open") != "open"

    def fstat(self, file_obj: object) -> os.stat_result:
        """Attributes of an open file."""
        assert isinstance(file_obj, upload.Upload | Download)
        if file_obj.fd < 0:
            raise SFTPFailure("upload already discarded")
        return os.fstat(file_obj.fd)

    async def fsync(self, file_obj: object) -> None:
        """Flush an upload (a close always does), off the event loop."""
        if isinstance(file_obj, upload.Upload):
            await upload.flush(file_obj)

    def fsetstat(self, file_obj: object, attrs: SFTPAttrs) -> None:
        """Times only (`put -p`, WinSCP); other attributes are ignored."""
        if isinstance(file_obj, upload.Upload) and file_obj.fd >= 0:
            times = _times(attrs)
            if times:
                os.utime(file_obj.fd, times)

    def setstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        """Times only, on the client's own writable names; other attributes are ignored."""
        name = writable_name(parse_path(path))
        times = _times(attrs)
        if stat_at(self._root, name) is None:
            raise SFTPNoSuchFile("no such file")
        if times:
            os.utime(name, times, dir_fd=self._root, follow_symlinks=False)

    def lsetstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        """Same as setstat: links are never followed."""
        self.setstat(path, attrs)

    # -- names ----------------------------------------------------------------------------

    def remove(self, path: bytes) -> None:
        """Remove one of the client's own pending files, or a rejected drop or error file
        (they take room of its quota until then)."""
        target = parse_path(path)
        if target.folder == REJECTED and target.name is not None:
            remove_rejected(self._root, target.name)
            return
        name = writable_name(target)
        info = stat_at(self._root, name)
        if info is None or not stat.S_ISREG(info.st_mode):
            raise SFTPNoSuchFile("no such file")
        os.unlink(name, dir_fd=self._root)

    def rename(self, oldpath: bytes, newpath: bytes) -> None:
        """SFTP rename: fails if the new name exists (protocol version 3)."""
        new = writable_name(parse_path(newpath))
        if stat_at(self._root, new) is not None:
            raise SFTPFileAlreadyExists(f"{new} already exists")
        self.posix_rename(oldpath, newpath)

    def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        """Rename within the client folder, replacing the new name (one atomic rename(2))."""
        old = writable_name(parse_path(oldpath))
        new = writable_name(parse_path(newpath))
        info = stat_at(self._root, old)
        if info is None or not stat.S_ISREG(info.st_mode):
            raise SFTPNoSuchFile(f"no such file: {old}")
        os.rename(old, new, src_dir_fd=self._root, dst_dir_fd=self._root)

    def exit(self) -> None:
        """Release the folder descriptor (asyncssh closed the open files first).

        Also report exit status 0 on the channel, as OpenSSH's sftp-server does under sshd:
        OpenSSH's scp (SFTP mode) fails a transfer whose channel closes without one.
        """
        if self._root >= 0:
            os.close(self._root)
            self._root = -1
        if not self.channel.is_closing():
            self.channel.exit(0)


def _times(attrs: SFTPAttrs) -> tuple[float, float] | None:
    if attrs.atime is None or attrs.mtime is None:
        return None
    return float(attrs.atime), float(attrs.mtime)
