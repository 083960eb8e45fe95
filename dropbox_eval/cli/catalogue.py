"""The catalogue of commands: each command's name, the module of `cli` that defines it and
its one-line help, so `--help` lists them all without importing any."""

from __future__ import annotations

# name -> (module of `cli` that defines it, its one-line help): a command's module is
# imported only when it runs, so `--help` and `--version` load click and little else.
# A test checks each line against the command it names.
COMMANDS: dict[str, tuple[str, str]] = {
    "audit": (
        "audit",
        "Show the operators' actions, oldest first: when, who, through what, what, on what, "
        "and the result (reads the state, writes nothing).",
    ),
    "batch": (
        "batches",
        "Show one batch (progress, attempts, last error, delivery) and each task's issue, "
        "status and summary.",
    ),
    "batches": (
        "batches",
        "List batches, the live first, then the most recently ended: id, client, status, "
        "progress, age.",
    ),
    "cancel": (
        "batches",
        "Cancel a running batch: close its open issues, keep finished results, emit the report.",
    ),
    "check": (
        "check",
        "Check that the index, the batch records and the ledger agree (read-only unless --repair).",
    ),
    "clients": ("clients", "Client accounts and credits."),
    "delete": (
        "retention",
        "Delete an ended batch: its report, task details, receipt and drop go; a tombstone "
        "(id, client, status, dates, task counts, charge) and the ledger stay.",
    ),
    "demo": (
        "demo",
        "The whole flow in this folder on the embedded sandbox forge; prints the report.",
    ),
    "emit": ("batches", "Deliver a finished batch's report (file or callback)."),
    "migrate": (
        "migrate",
        "Create or update the PostgreSQL schema (SAAS_EVAL_DATABASE_URL; `run` does too), "
        "or move a TinyDB state folder into it (--from-files).",
    ),
    "pause": (
        "pausing",
        "Hold intake: files wait in the inbox, forge writes stop; polling and delivery go on.",
    ),
    "poll": (
        "batches",
        "Poll the forge once (every running batch, or BATCH_ID) and store finished results.",
    ),
    "prune": (
        "retention",
        "Delete the batches that ended before the retention (keeping tombstones and the "
        "ledger: balances do not move), and the rejected drops, error files and cancel "
        "requests filed before it.",
    ),
    "resume": (
        "pausing",
        "End the pause: the service takes the waiting files and resumes forge writes.",
    ),
    "retry": (
        "retry",
        "Retry a failed or expired batch: a new batch with its failed and aborted tasks.",
    ),
    "run": (
        "service",
        "Run the service: watch the inbox, open issues, poll, emit (until SIGINT/SIGTERM).",
    ),
    "sandbox": (
        "service",
        "Run the sandbox forge (Gitea API subset + simulated lane) alone; prints the "
        "settings that point the service at it, and the tokens of the lane and of a human "
        "user.",
    ),
    "schema": (
        "validate",
        "Print the JSON Schema (draft 2020-12) of the batch file, receipt, error file or report.",
    ),
    "serve": (
        "service",
        "Serve the HTTP API (OpenAPI at /docs), /metrics, /healthz, /readyz and /operator.",
    ),
    "sftp": (
        "sftp",
        "Run the SFTP endpoint beside `run` (keys: `clients add-key`; until SIGINT/SIGTERM).",
    ),
    "status": (
        "status",
        "Whether the service runs, since when, its last poll and last error (writes nothing).",
    ),
    "submit": (
        "submit",
        "Drop FILE into the inbox once and print its receipt or error document (exit 4 "
        "when rejected).",
    ),
    "validate": (
        "validate",
        "Check batch files as the inbox would: exit 1 with one `FILE: message` line per problem.",
    ),
    "watch": (
        "batches",
        "Follow one batch until it ends (exit 0), or until the service stops (exit 1); "
        "Ctrl-C: 130.",
    ),
}
