"""The Python client test (internal/sqlapi): psycopg 3, connection from the
libpq environment (PGHOST, ...). Prints one line per step for the Go test."""
import json
import os
import time

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

schema = sql.Identifier(os.environ["PGWAKE_SCHEMA"])
queue = os.environ["PGWAKE_QUEUE"]
jobs = int(os.environ["PGWAKE_JOBS"])
gap = int(os.environ["PGWAKE_GAP_MS"]) / 1000

insert = sql.SQL("INSERT INTO {}.orders (note) VALUES (%s)").format(schema)
enqueue = sql.SQL("SELECT {}.enqueue(%s, %s, queue => %s)").format(schema)

with psycopg.connect() as conn:
    # Rolled back: the order and the job go together.
    with conn.cursor() as cur:
        cur.execute(insert, ("python rollback",))
        cur.execute(enqueue, ("sqlapi.test", Jsonb({"client": "python"}), queue))
        job_id = cur.fetchone()[0]
    conn.rollback()
    print("rolledback", job_id, flush=True)

    for n in range(jobs):
        with conn.cursor() as cur:
            cur.execute(insert, (f"python {n}",))
            cur.execute(enqueue, ("sqlapi.test", Jsonb({"client": "python", "n": n}), queue))
            job_id = cur.fetchone()[0]
        commit_us = time.time_ns() // 1000
        conn.commit()
        print("committed", job_id, commit_us, flush=True)
        time.sleep(gap)

    # An invalid queue name: PW002.
    try:
        with conn.cursor() as cur:
            cur.execute(enqueue, ("sqlapi.test", Jsonb({}), "Not A Queue"))
    except psycopg.Error as e:
        print("sqlstate", e.sqlstate, e.diag.column_name, flush=True)
        conn.rollback()
