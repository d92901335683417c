-- One run of the psql client test (internal/sqlapi): an enqueue rolled back
-- with its business write, one committed, one bad input.
-- Variables: schema, queue, n (this job's number).
\set ON_ERROR_STOP 0
\pset tuples_only on
\pset format unaligned

BEGIN;
INSERT INTO :"schema".orders (note) VALUES ('psql rollback ' || :'n');
SELECT :"schema".enqueue('sqlapi.test', jsonb_build_object('client', 'psql', 'n', :'n'::int), queue => :'queue') AS id \gset
ROLLBACK;
\echo rolledback :id

BEGIN;
INSERT INTO :"schema".orders (note) VALUES ('psql ' || :'n');
SELECT :"schema".enqueue('sqlapi.test', jsonb_build_object('client', 'psql', 'n', :'n'::int), queue => :'queue') AS id \gset
SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS commit_us \gset
COMMIT;
\echo committed :id :commit_us

-- A kind with a space: PW001.
SELECT :"schema".enqueue('bad kind', queue => :'queue');
-- psql keeps the SQLSTATE of the last error, not its COLUMN field.
\echo sqlstate :LAST_ERROR_SQLSTATE -
