-- The SFTP endpoint's keys, shared by every node on this database (store/pg/sftpkeys.py):
-- one host key, so that each node's endpoint shows the same one, and the clients' public
-- keys, so that a key added or revoked on one node counts on all at the next login.
CREATE TABLE sftp_host_keys (
    algorithm   text PRIMARY KEY,               -- 'ssh-ed25519'
    private_key text NOT NULL,                  -- OpenSSH format: a secret at rest, as the
                                                -- clients' webhook secrets (clients.doc)
    created_at  timestamptz NOT NULL
);

CREATE TABLE sftp_keys (
    client_id    text NOT NULL REFERENCES clients,
    fingerprint  text NOT NULL,                 -- SHA256:..., as OpenSSH prints it
    line         text NOT NULL,                 -- the OpenSSH public key line
    seq          bigint GENERATED ALWAYS AS IDENTITY,  -- the order keys were added in
    added_at     timestamptz NOT NULL,
    last_used_at timestamptz,                   -- NULL: never; written at most once an hour
    PRIMARY KEY (client_id, fingerprint)
);
