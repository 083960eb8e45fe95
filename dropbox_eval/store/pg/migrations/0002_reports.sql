-- A batch's report, fixed at its close, kept beside its record (as the files' engine keeps
-- state/reports/<id>.json): the exact bytes delivered, so a later re-delivery sends them.
ALTER TABLE batches ADD COLUMN report bytea;
