"""`dropbox-eval migrate`: create or update the PostgreSQL schema (store/pg/migrate.py),
and `--from-files`: move a TinyDB state folder into it (store/pg/fromfiles.py), compare
the two stores (ops/storecompare.py) and check the database (ops/statecheck.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import EXIT_FAILED, EXIT_OK, ConfigError
from . import Context
from .output import emit_json, friendly_errors, json_option

if TYPE_CHECKING:
    from ..config import Settings
    from ..ops.statecheck import Finding, StateCheck
    from ..ops.storecompare import Difference
    from ..store import Store
    from ..store.pg.fromfiles import Copied


@dataclass
class Moved:
    """What `--from-files` did: the copy, the stores' differences, the database's check."""

    source: Path
    copied: Copied
    differences: list[Difference]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        """The two stores agree and the database's state check found nothing."""
        return not self.differences and not self.findings

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "from_files": str(self.source),
            "copied": self.copied.as_dict(),
            "differences": [d.as_dict() for d in self.differences],
            "findings": [f.as_dict() for f in self.findings],
        }


@click.command()
@click.option(
    "--from-files",
    "from_files",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    metavar="STATE_DIR",
    help="Copy this TinyDB state folder into the database, which must be empty; then "
    "compare the two and check the database.",
)
@json_option
@click.pass_obj
def migrate(obj: Context, from_files: Path | None, as_json: bool) -> None:
    """Create or update the PostgreSQL schema (SAAS_EVAL_DATABASE_URL; `run` does too), or
    move a TinyDB state folder into it (--from-files).

    Each version is applied once, under a lock. Exit 0 when it is up to date; a database
    newer than this version of dropbox-eval is refused.

    --from-files STATE_DIR copies the folder's clients (keys, secrets), ledger (the same
    entries, order and balances), batches (live, archived and deleted: records, tasks,
    reports, tombstones) and audit log in one transaction. It refuses, copying nothing
    (exit 1), a database that already holds any of them, a folder a service runs on
    (exit 5) and a folder its own state check finds a problem in (`check --repair` it
    first, without SAAS_EVAL_DATABASE_URL). Then it compares what the two stores answer
    and runs the state check on the database: exit 0 when they agree and the check finds
    nothing, 1 otherwise, one line per difference. The folder is left as it was."""
    with friendly_errors(as_json):
        settings = obj.settings()
        url = settings.database_url
        if not url:
            raise ConfigError(
                "SAAS_EVAL_DATABASE_URL is not set: the schema is PostgreSQL's "
                "(without it the store is TinyDB files, which need no migration)"
            )
        from ..store.pg.migrate import latest_version
        from ..store.pg.migrate import migrate as apply

        applied = apply(url)
        moved = None if from_files is None else _move(settings, url, from_files)
    if as_json:
        done = {"ok": True, "applied": applied, "version": latest_version()}
        emit_json(done if moved is None else {**done, **moved.as_dict(), "ok": moved.ok})
    elif applied:
        click.echo(f"applied {', '.join(applied)}: schema at version {latest_version()}")
    else:
        click.echo(f"up to date: schema at version {latest_version()}")
    if moved is not None:
        if not as_json:
            _print(moved)
        sys.exit(EXIT_OK if moved.ok else EXIT_FAILED)


def _move(settings: Settings, url: str, folder: Path) -> Moved:
    """Copy the folder (held under its store lock throughout, so that no command changes
    it meanwhile), compare, check."""
    from ..ops.storecompare import compare_stores
    from ..store.engine import TinyDBStore
    from ..store.pg.fromfiles import SourceNotReady, copy_state
    from ..store.servicestate import already_running, service_running
    from ..store.statefolder import open_store

    if service_running(folder):
        raise already_running(folder)
    source = TinyDBStore(folder, read_only=True)
    with source.locked():
        problems = _state_check(source, settings).run(repair=False)
        if problems:
            raise SourceNotReady(
                f"the state folder {folder} is not consistent ({len(problems)} finding(s) of "
                f"its state check, the first: {problems[0].subject}: {problems[0].problem}): "
                f"repair it with `dropbox-eval --state-dir {folder} check --repair` "
                "(SAAS_EVAL_DATABASE_URL unset), then copy it; nothing was copied",
                findings=[p.as_dict() for p in problems],
            )
        copied = copy_state(source, url)
        target = open_store(settings.state_path, read_only=True, database_url=url)
        try:
            differences = compare_stores(
                source, target, names=("files", "database"), batch_ids=copied.buried
            )
            findings = _state_check(target, settings).run(repair=False)
        finally:
            target.close()
    return Moved(folder, copied, differences, findings)


def _state_check(store: Store, settings: Settings) -> StateCheck:
    from ..billing.accounts import Billing
    from ..ops.statecheck import StateCheck

    return StateCheck(store, Billing(store, settings.task_price), settings.delivery_max_attempts)


def _print(moved: Moved) -> None:
    click.echo(f"copied {moved.source}: {moved.copied.line()}")
    if moved.differences:
        click.echo(f"the files and the database differ ({len(moved.differences)}):")
        for difference in moved.differences:
            click.echo(f"  {difference.line()}")
    else:
        click.echo("compared the files with the database: they agree")
    for finding in moved.findings:
        click.echo(f"state check of the database: {finding.subject}: {finding.problem}")
    if not moved.findings:
        click.echo("state check of the database: consistent (index, records and ledger agree)")


COMMANDS = [migrate]
