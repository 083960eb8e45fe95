-- The store's tables (store/pg/__init__.py says what each holds). Applied once, in one
-- transaction, by migrate.py; never edited once released: a change is a new file.

CREATE TABLE clients (
    client_id   text PRIMARY KEY,
    balance     bigint NOT NULL DEFAULT 0,      -- moved only by ledger rows
    held        bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL,
    doc         jsonb NOT NULL                  -- the Client's other fields (secrets, keys)
);

CREATE SEQUENCE history_order;                  -- the order batches were archived in

CREATE TABLE batches (
    batch_id    text PRIMARY KEY,
    client_id   text NOT NULL REFERENCES clients,
    status      text NOT NULL,
    repo_folded text NOT NULL,
    sha256      text,                           -- duplicate keys; NULL once erased
    batch_ref   text,
    summary     jsonb NOT NULL,                 -- the listing's row (BatchRow)
    record      jsonb,                          -- the BatchRecord; NULL once buried
    archived_at timestamptz,                    -- NULL: live
    archive_seq bigint UNIQUE,                  -- nextval(history_order) when archived
    task_counts jsonb,                          -- tasks per status, as archived
    tombstone   jsonb,                          -- set when buried (NULL: not buried)
    CHECK ((archived_at IS NULL) = (archive_seq IS NULL)),
    CHECK ((record IS NULL) = (tombstone IS NOT NULL))
);
CREATE INDEX batches_live ON batches (batch_id) WHERE archived_at IS NULL;
CREATE INDEX batches_client ON batches (client_id, batch_id);
CREATE INDEX batches_client_history ON batches (client_id, archive_seq);
CREATE INDEX batches_sha256 ON batches (client_id, sha256) WHERE sha256 IS NOT NULL;
CREATE INDEX batches_ref ON batches (client_id, batch_ref) WHERE batch_ref IS NOT NULL;

CREATE TABLE tasks (
    batch_id    text NOT NULL REFERENCES batches ON DELETE CASCADE,
    position    integer NOT NULL,
    task_id     text NOT NULL,
    doc         jsonb NOT NULL,                 -- the TaskRecord
    PRIMARY KEY (batch_id, task_id),
    UNIQUE (batch_id, position)
);

CREATE TABLE ledger (
    seq           bigserial PRIMARY KEY,        -- posting order
    entry_id      text NOT NULL UNIQUE,
    client_id     text NOT NULL REFERENCES clients,
    kind          text NOT NULL
                  CHECK (kind IN ('fund', 'hold', 'charge', 'release', 'write_off')),
    amount        bigint NOT NULL,
    held_change   bigint NOT NULL,
    balance_after bigint NOT NULL,
    held_after    bigint NOT NULL,
    batch_id      text,                         -- kept when its batch is erased: no FK
    note          text NOT NULL DEFAULT '',
    at            timestamptz NOT NULL
);
-- Money moves once per batch and kind: a second hold, charge or release of a batch fails
-- inside its transaction, whichever node or process posts it.
CREATE UNIQUE INDEX ledger_once_per_batch ON ledger (batch_id, kind) WHERE batch_id IS NOT NULL;
CREATE INDEX ledger_client ON ledger (client_id, seq);
CREATE INDEX ledger_batch ON ledger (batch_id) WHERE batch_id IS NOT NULL;

CREATE TABLE audit_log (
    seq      bigserial PRIMARY KEY,
    at       text NOT NULL,
    actor    text NOT NULL,
    via      text NOT NULL,
    action   text NOT NULL,
    target   text NOT NULL,
    result   text NOT NULL,
    key_id   text,
    detail   jsonb NOT NULL
);
