"""Built-in SFTP endpoint: key logins, one jailed folder per client, uploads
complete by close. Run with `dropbox-eval sftp` beside `dropbox-eval run`."""

from .status import sftp_status

__all__ = ["sftp_status"]
