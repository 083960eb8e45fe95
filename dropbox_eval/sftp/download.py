"""Reading a file of a client's view: a receipt, an error file or a report, opened
read-only relative to its folder's descriptor, never through a link, and only when it is
a regular file (a FIFO planted in the outbox neither blocks the open nor is read)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from asyncssh import SFTPNoSuchFile, SFTPPermissionDenied

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Download:
    """An open receipt, error file or report."""

    fd: int


def open_regular(folder_fd: int, name: str) -> Download:
    """Open the regular file `name` of an open folder for reading; SFTP errors otherwise."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=folder_fd)
    except FileNotFoundError:
        raise SFTPNoSuchFile("no such file") from None
    except OSError:
        raise SFTPPermissionDenied("not a regular file") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SFTPPermissionDenied("not a regular file")
    return Download(fd)


def read(download: Download, offset: int, size: int) -> bytes:
    """Up to `size` bytes of an open download from `offset`."""
    return os.pread(download.fd, size, offset)
