-- Service nodes sharing this database, and the leases by which they split the work
-- (store/nodes.py). Times are the database's own clock, so nodes' clocks may disagree.
CREATE TABLE nodes (
    node_id       text PRIMARY KEY,
    host          text NOT NULL,
    pid           integer NOT NULL,
    version       text NOT NULL,
    lease_seconds double precision NOT NULL,  -- a heartbeat older than this: lost
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    stopped_at    timestamptz                 -- NULL while it runs (or was killed)
);

CREATE TABLE leases (
    kind       text NOT NULL CHECK (kind IN ('drop', 'poll', 'deliver')),
    key        text NOT NULL,
    node_id    text NOT NULL,
    taken_at   timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE INDEX leases_node ON leases (node_id);
