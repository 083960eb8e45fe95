"""Folder listings of a client's SFTP view, read in pages off the event loop.

A listing (the client folder, `accepted/`, `rejected/`, `reports/`, `reports/undelivered/`)
may hold thousands of names: a client with 2,000 batches has 2,000 receipts and 2,000
reports. Its names are read once (the folder here, or the client's batches from the state on
the reports view's own thread, reports.py), then stated and encoded a page at a time in a
worker thread, as the client asks for the next page (SFTP readdir). The event loop, which serves
every other session, only hands the pages on. A page opens the folder again, so a listing
left unfinished by the client holds no descriptor.
"""

from __future__ import annotations

import asyncio
import functools
import grp
import os
import pwd
from collections.abc import AsyncIterator, Callable

from asyncssh import SFTPAttrs, SFTPName, SFTPNoSuchFile

from .paths import Target, listed, stat_at, visible

PAGE = 128  # names per SFTP readdir answer (asyncssh's own cap)

FolderOpener = Callable[[str | None], int]
Render = Callable[[SFTPName], object]


class Listing:
    """The listings of one session's view: its folder descriptor and its reports."""

    def __init__(self, open_folder: FolderOpener, render: Render) -> None:
        """`open_folder(folder)` returns a new descriptor of a view folder (the caller
        closes it); `render` fills in an entry's `ls -l` line."""
        self._open_folder = open_folder
        self._render = render

    async def pages(self, folder: str | None, names: list[str]) -> AsyncIterator[list[SFTPName]]:
        """The visible entries among `names` in `folder`, a page at a time."""
        for start in range(0, len(names), PAGE):
            page = names[start : start + PAGE]
            yield await asyncio.to_thread(self._page, folder, page)

    async def folder_names(self, folder: str | None) -> list[str]:
        """The names a listing of an on-disk folder shows, sorted (read off the loop)."""
        return await asyncio.to_thread(self._folder_names, folder)

    def _folder_names(self, folder: str | None) -> list[str]:
        fd = self._open_folder(folder)
        try:
            return [name for name in sorted(os.listdir(fd)) if listed(folder, name)]
        finally:
            os.close(fd)

    def _page(self, folder: str | None, names: list[str]) -> list[SFTPName]:
        """Stat and encode one page of names (in a worker thread)."""
        try:
            fd = self._open_folder(folder)
        except SFTPNoSuchFile:  # gone since the names were read: the rest is empty
            return []
        try:
            found = []
            for name in names:
                info = stat_at(fd, name)
                if info is not None and visible(info, Target(folder, name)):
                    found.append(self._entry(name, info))
            return found
        finally:
            os.close(fd)

    def _entry(self, name: str, info: os.stat_result) -> SFTPName:
        entry = SFTPName(name.encode("utf-8"), attrs=SFTPAttrs.from_local(info))
        self._render(entry)
        return entry

    def folder_entry(self, name: str, info: os.stat_result) -> SFTPName:
        """A folder of the view that is not on disk where it is shown (`reports/`)."""
        return self._entry(name, info)


@functools.lru_cache(maxsize=64)
def user_name(uid: int | None) -> str:
    """The `ls -l` owner name of a uid, looked up once per uid (not once per entry)."""
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@functools.lru_cache(maxsize=64)
def group_name(gid: int | None) -> str:
    """The `ls -l` group name of a gid, looked up once per gid."""
    if gid is None:
        return ""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
