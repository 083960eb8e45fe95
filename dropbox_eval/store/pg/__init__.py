"""The PostgreSQL engine of the store contract, chosen by `SAAS_EVAL_DATABASE_URL`
(statefolder.open_store); the only package that imports psycopg, loaded only then, so a
service on TinyDB needs neither the driver nor a database.

Tables (migrations/0001_init.sql)::

    clients      one row per client: its balance and held credits (moved only with a
                 ledger row, in the same transaction) and its other fields as jsonb
    batches      one row per batch, live, archived or buried: its record (jsonb), its
                 listing row (`summary`), and the columns that select it (client, status,
                 case-folded repo, duplicate keys, `archive_seq`: the history's order)
    tasks        one row per task (jsonb), by batch and position
    ledger       one row per money movement; UNIQUE (batch_id, kind): a batch is held,
                 charged and released at most once, whichever process posts it
    audit_log    one row per operator action
    schema_migrations   the versions applied (migrate.py)
"""
