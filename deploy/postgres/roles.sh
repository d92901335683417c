#!/bin/sh
# Creates the roles of docs/grants.sql for the docker compose demo and
# grants them their parts, after `pgwake migrate` ran as the schema's owner.
# Connection from the libpq environment (PGHOST, PGUSER = the owner, ...).
# Each role's password is its name: a demo on 127.0.0.1, not a deployment.
# Idempotent. Kept correct by cmd/pgwake/deploy_test.go (TestComposeRoles
# runs it against a real PostgreSQL).
set -eu
grants=${PGWAKE_GRANTS:-/grants.sql}
schema=${PGWAKE_SCHEMA:-pgwake}

psql -v ON_ERROR_STOP=1 -q <<'SQL'
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES
        ('pgwake_producer', ''), ('pgwake_worker', ''), ('pgwake_operator', ''),
        ('pgwake_stream', 'REPLICATION')) AS t(name, attrs)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r.name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I LOGIN %s PASSWORD %L', r.name, r.attrs, r.name);
        END IF;
    END LOOP;
END
$$;
SQL

sed -e "s/{{schema}}/$schema/g" \
    -e 's/{{producer_role}}/pgwake_producer/g' \
    -e 's/{{worker_role}}/pgwake_worker/g' \
    -e 's/{{operator_role}}/pgwake_operator/g' \
    -e 's/{{stream_role}}/pgwake_stream/g' \
    -e 's/{{sql_producer_role}}/pgwake_producer/g' \
    "$grants" | psql -v ON_ERROR_STOP=1 -q
echo "roles pgwake_producer, pgwake_worker, pgwake_operator, pgwake_stream granted on schema $schema"
