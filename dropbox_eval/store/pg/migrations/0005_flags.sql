-- Flags every node sees at once (store/flags.py): the pause, as one row while it holds.
CREATE TABLE flags (
    name   text PRIMARY KEY,
    record jsonb NOT NULL
);
