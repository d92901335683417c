-- The enqueue floor (issue 12): fewer function layers around the job row
-- and its event on the one-job path that Enqueue and enqueue() take. Same
-- SQL API (signatures, defaults, error codes and messages), same wake-up
-- protocol. Two layers go from that path:
--
--  * valid_job is now an SQL function of one expression, with no SET
--    clause, so the planner inlines it into enqueue_jobs' statement: no
--    plpgsql call and no search_path save and restore per job. Only a job
--    that fails the expression calls job_error (the previous plpgsql
--    valid_job, unchanged), which raises the first error in queue.NewJob's
--    order, or returns true if the expression was stricter than it. Every
--    name in the expression is schema-qualified (functions pg_catalog.*,
--    operators OPERATOR(pg_catalog.x), casts to pg_catalog types), so it
--    resolves the same under any search_path.
--  * wake_needed() stays a call of its own: written into the statement,
--    its look at the waiters would use the statement's snapshot, taken
--    before the try-lock, and could miss a worker that marked itself idle
--    and passed its barrier in between (a lost wake-up); the function's
--    statement takes a snapshot after the lock.
--  * The event watchers' commit-time trigger (migration 0017): when no
--    watcher is registered (none seen in the last 60 s) as the enqueue
--    statement runs, the statement marks the transaction in the
--    transaction-local setting the trigger's WHEN tests, so no commit-time
--    call is queued at all. With a watcher, the trigger decides at commit
--    as before.
-- {{schema}} is the quoted schema name, {{wake_channel}} its NOTIFY
-- channel, {{events_notify_guc}} the name of the setting as a literal.

-- job_error is migration 0008's valid_job: it raises job ord's first error
-- (from 1, field by field in queue.NewJob's order), else returns true.
CREATE FUNCTION {{schema}}.job_error(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
    pr integer, ma integer, uk text, payload_limit integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF q IS NOT NULL AND (q = '' OR pg_catalog.octet_length(q) > 63 OR q !~ '^[a-z0-9][a-z0-9_.-]*$') THEN
        RETURN {{schema}}.invalid('PW002', ord, 'queue', pg_catalog.format('invalid queue name %L: 1 to 63 bytes of lowercase letters, digits, ''_'', ''.'', ''-'', starting with a letter or digit', q));
    ELSIF k IS NULL OR k = '' THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', 'invalid kind: empty');
    ELSIF pg_catalog.octet_length(k) > 255 THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', pg_catalog.format('invalid kind: %s bytes, the limit is 255', pg_catalog.octet_length(k)));
    ELSIF k ~ '[[:space:][:cntrl:]]' THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', pg_catalog.format('invalid kind %L: use printable characters without spaces', k));
    ELSIF p IS NOT NULL AND payload_limit IS NOT NULL AND pg_catalog.octet_length(p::text) > payload_limit THEN
        RETURN {{schema}}.invalid('PW003', ord, 'payload', pg_catalog.format('payload too large: %s bytes, the limit is %s', pg_catalog.octet_length(p::text), payload_limit));
    ELSIF pr IS NOT NULL AND (pr < -32768 OR pr > 32767) THEN
        RETURN {{schema}}.invalid('PW004', ord, 'priority', pg_catalog.format('priority out of range: %s is outside -32768..32767', pr));
    ELSIF ra IS NOT NULL AND NOT pg_catalog.isfinite(ra) THEN
        RETURN {{schema}}.invalid('PW005', ord, 'run_after', pg_catalog.format('invalid schedule: run_after %s is not a finite time', ra));
    ELSIF ra IS NULL AND d IS NOT NULL AND (NOT pg_catalog.isfinite(d) OR d < interval '0') THEN
        RETURN {{schema}}.invalid('PW005', ord, 'delay', pg_catalog.format('invalid schedule: delay %s is negative or infinite', d));
    ELSIF ma IS NOT NULL AND ma < 1 THEN
        RETURN {{schema}}.invalid('PW006', ord, 'max_attempts', pg_catalog.format('max attempts must be at least 1: got %s', ma));
    ELSIF uk IS NOT NULL AND pg_catalog.octet_length(uk) > 1024 THEN
        RETURN {{schema}}.invalid('PW007', ord, 'unique_key', pg_catalog.format('invalid unique key: %s bytes, the limit is 1024', pg_catalog.octet_length(uk)));
    END IF;
    RETURN true;
END
$$;

-- valid_job: true for a valid job, else job_error's error. Inlinable: SQL,
-- one expression, no SET clause, not SECURITY DEFINER; every name
-- qualified (it runs under its caller's search_path when not inlined).
CREATE OR REPLACE FUNCTION {{schema}}.valid_job(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
    pr integer, ma integer, uk text, payload_limit integer) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
SELECT CASE WHEN
        (q IS NULL OR (q OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(q) OPERATOR(pg_catalog.<=) 63
            AND q OPERATOR(pg_catalog.~) '^[a-z0-9][a-z0-9_.-]*$'))
        AND k IS NOT NULL AND k OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(k) OPERATOR(pg_catalog.<=) 255
        AND k OPERATOR(pg_catalog.!~) '[[:space:][:cntrl:]]'
        AND (p IS NULL OR payload_limit IS NULL
            OR pg_catalog.octet_length(p::pg_catalog.text) OPERATOR(pg_catalog.<=) payload_limit)
        AND (pr IS NULL OR (pr OPERATOR(pg_catalog.>=) -32768 AND pr OPERATOR(pg_catalog.<=) 32767))
        AND (ra IS NULL OR pg_catalog.isfinite(ra))
        AND (ra IS NOT NULL OR d IS NULL OR (pg_catalog.isfinite(d) AND d OPERATOR(pg_catalog.>=) interval '0'))
        AND (ma IS NULL OR ma OPERATOR(pg_catalog.>=) 1)
        AND (uk IS NULL OR pg_catalog.octet_length(uk) OPERATOR(pg_catalog.<=) 1024)
    THEN true
    ELSE {{schema}}.job_error(ord, k, p, q, ra, d, pr, ma, uk, payload_limit) END
$$;

-- enqueue_jobs: migration 0014's, with the look for event watchers in
-- both statements.
-- enqueue_jobs enqueues the jobs given column-wise (element i of every
-- array is job i; a NULL array or element takes the default) and returns,
-- in input order, each job's id and whether its unique key was held (then
-- the id is the holder's and nothing was written for it); held_until is
-- NULL unless a unique period was given, then for each job whose key was
-- held for a period, when that period ends.
-- payload_limit bounds each payload's JSON text as PostgreSQL prints it, in
-- bytes (NULL: no bound; the Go client checks its own
-- Config.MaxPayloadBytes on the text it sends).
--
-- One job (enqueue, the Go client's Enqueue) takes a plain INSERT with
-- VALUES; more take the same statement over unnest. Either way the usual
-- call is one statement: the jobs are checked (valid_job) row by row as they
-- are inserted, so an invalid job raises before the statement ends and
-- everything it wrote goes with it. Keys held for a period are taken first,
-- one by one, only when a period is given. Generic plans: planning the
-- statement anew on every call would cost more than running it.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_jobs(
    kinds          text[],
    payloads       jsonb[]       DEFAULT NULL,
    queues         text[]        DEFAULT NULL,
    run_afters     timestamptz[] DEFAULT NULL,
    delays         interval[]    DEFAULT NULL,
    priorities     integer[]     DEFAULT NULL,
    attempt_limits integer[]     DEFAULT NULL,
    unique_keys    text[]        DEFAULT NULL,
    payload_limit  integer       DEFAULT 1048576,
    unique_scopes  text[]        DEFAULT NULL,
    unique_holds   text[]        DEFAULT NULL,
    unique_periods interval[]    DEFAULT NULL,
    metadatas      jsonb[]       DEFAULT NULL,
    OUT ids        bigint[],
    OUT duplicates boolean[],
    OUT held_until timestamptz[]
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    n        integer := coalesce(pg_catalog.cardinality(kinds), 0);
    one_id   bigint;
    todo     integer[];
    missing  integer[];
    inserted integer[];
    all_ids  bigint[];
    new_ids  bigint[];
    preset   bigint[];
    woke     bigint;
    round    integer := 0;
    partial  boolean := false;
    r        record;
    got      bigint;
    slot_key text;
    until    timestamptz;
BEGIN
    IF n = 0 THEN
        ids := '{}';
        duplicates := '{}';
        held_until := '{}';
        RETURN;
    END IF;
    IF (payloads IS NOT NULL AND pg_catalog.cardinality(payloads) <> n)
        OR (queues IS NOT NULL AND pg_catalog.cardinality(queues) <> n)
        OR (run_afters IS NOT NULL AND pg_catalog.cardinality(run_afters) <> n)
        OR (delays IS NOT NULL AND pg_catalog.cardinality(delays) <> n)
        OR (priorities IS NOT NULL AND pg_catalog.cardinality(priorities) <> n)
        OR (attempt_limits IS NOT NULL AND pg_catalog.cardinality(attempt_limits) <> n)
        OR (unique_keys IS NOT NULL AND pg_catalog.cardinality(unique_keys) <> n)
        OR (unique_scopes IS NOT NULL AND pg_catalog.cardinality(unique_scopes) <> n)
        OR (unique_holds IS NOT NULL AND pg_catalog.cardinality(unique_holds) <> n)
        OR (unique_periods IS NOT NULL AND pg_catalog.cardinality(unique_periods) <> n)
        OR (metadatas IS NOT NULL AND pg_catalog.cardinality(metadatas) <> n) THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = 'pgwake: enqueue_jobs: every array must be NULL or as long as kinds';
    END IF;
    IF unique_periods IS NOT NULL AND unique_keys IS NOT NULL THEN
        -- Keys held for a period: take each slot (or find who holds it)
        -- before inserting, under the id its job will have.
        held_until := pg_catalog.array_fill(NULL::timestamptz, ARRAY[n]);
        ids := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
        duplicates := pg_catalog.array_fill(false, ARRAY[n]);
        preset := pg_catalog.array_fill(NULL::bigint, ARRAY[n]);
        FOR o IN 1 .. n LOOP
            -- Every job's id is taken here, in input order.
            preset[o] := pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass);
            CONTINUE WHEN unique_periods[o] IS NULL OR coalesce(unique_keys[o], '') = '';
            PERFORM {{schema}}.valid_job(o, kinds[o], payloads[o], queues[o], run_afters[o], delays[o],
                priorities[o], attempt_limits[o], unique_keys[o], payload_limit);
            PERFORM {{schema}}.valid_unique(o, unique_scopes[o], unique_holds[o], unique_periods[o]);
            slot_key := CASE WHEN unique_scopes[o] = 'queue' THEN 'queue' || chr(31) || coalesce(queues[o], 'default')
                ELSE 'kind' || chr(31) || kinds[o] END || chr(31) || unique_keys[o];
            got := NULL;
            INSERT INTO {{schema}}.unique_periods AS u (slot, job_id, held_until)
            VALUES (slot_key, preset[o], pg_catalog.now() + unique_periods[o])
            ON CONFLICT (slot) DO UPDATE SET job_id = EXCLUDED.job_id, held_until = EXCLUDED.held_until
                WHERE u.held_until <= pg_catalog.now()
            RETURNING u.job_id INTO got;
            IF got IS NULL THEN
                SELECT u.job_id, u.held_until INTO got, until FROM {{schema}}.unique_periods u WHERE u.slot = slot_key;
                ids[o] := got;
                held_until[o] := until;
                duplicates[o] := true;
                partial := true;
            END IF;
        END LOOP;
        IF partial THEN
            SELECT pg_catalog.array_agg(o ORDER BY o) INTO todo
            FROM pg_catalog.generate_series(1, n) o WHERE NOT duplicates[o];
            IF todo IS NULL THEN
                RETURN; -- every key was held
            END IF;
        END IF;
    END IF;
    WHILE n = 1 LOOP
        WITH ins AS (
            INSERT INTO {{schema}}.jobs AS j (id, queue, kind, payload, priority, run_after, max_attempts, unique_key, unique_scope, unique_hold, metadata)
            SELECT coalesce(preset[1], pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass)),
                coalesce(queues[1], 'default'), kinds[1], coalesce(payloads[1], '{}'::jsonb), coalesce(priorities[1], 0)::smallint,
                coalesce(run_afters[1], pg_catalog.now() + coalesce(delays[1], interval '0')), coalesce(attempt_limits[1], 5),
                nullif(unique_keys[1], ''), CASE WHEN unique_scopes[1] = 'queue' THEN 'queue' END,
                CASE WHEN unique_periods[1] IS NOT NULL THEN 'period' WHEN unique_holds[1] IN ('pending', 'succeeded') THEN unique_holds[1] END,
                metadatas[1]
            WHERE {{schema}}.valid_job(1, kinds[1], payloads[1], queues[1], run_afters[1], delays[1],
                priorities[1], attempt_limits[1], unique_keys[1], payload_limit)
                AND (unique_scopes IS NULL AND unique_holds IS NULL AND unique_periods IS NULL
                    OR {{schema}}.valid_unique(1, unique_scopes[1], unique_holds[1], unique_periods[1]))
                -- No event watcher: mark the transaction so that the
                -- events trigger queues no commit-time call (above).
                AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                        WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                    OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
            ON CONFLICT DO NOTHING
            RETURNING j.id, j.queue, j.kind, j.run_after
        ), ev AS (
            INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
            SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM ins x
        ), wake AS (
            SELECT pg_catalog.pg_notify({{wake_channel}}, x.queue || CASE WHEN x.run_after > pg_catalog.clock_timestamp()
                THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM x.run_after - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
                ELSE '' END)
            FROM ins x WHERE {{schema}}.wake_needed(x.queue)
        )
        SELECT x.id, (SELECT pg_catalog.count(*) FROM wake) INTO one_id, woke FROM ins x;
        IF one_id IS NOT NULL THEN
            ids := ARRAY[one_id];
            duplicates := ARRAY[false];
            RETURN;
        END IF;
        -- The key is held: the holder's id, unless it finished since.
        one_id := {{schema}}.unique_holder(unique_scopes[1] IS DISTINCT FROM 'queue',
            CASE WHEN unique_scopes[1] = 'queue' THEN coalesce(queues[1], 'default') ELSE kinds[1] END, unique_keys[1]);
        IF one_id IS NOT NULL THEN
            ids := ARRAY[one_id];
            duplicates := ARRAY[true];
            RETURN;
        END IF;
        round := round + 1;
        IF round = 5 THEN
            RAISE EXCEPTION USING ERRCODE = '40001',
                MESSAGE = 'pgwake: enqueue: unique keys kept changing state; gave up after 5 rounds';
        END IF;
    END LOOP;
    LOOP
        -- Ids come from the jobs' sequence in input order (or were taken
        -- with a period's slot), so rows map back to their input. Each job
        -- is checked field by field in queue.NewJob's order. A held unique
        -- key inserts nothing for that input.
        WITH input AS MATERIALIZED (
            SELECT t.ord::integer AS ord, coalesce(preset[t.ord], pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass)) AS id,
                coalesce(t.q, 'default') AS queue, t.k AS kind, coalesce(t.p, '{}'::jsonb) AS payload,
                coalesce(t.pr, 0) AS priority,
                coalesce(t.ra, pg_catalog.now() + coalesce(t.d, interval '0')) AS run_after,
                coalesce(t.ma, 5) AS max_attempts, nullif(t.uk, '') AS unique_key,
                CASE WHEN t.us = 'queue' THEN 'queue' END AS unique_scope,
                CASE WHEN t.up IS NOT NULL THEN 'period' WHEN t.uh IN ('pending', 'succeeded') THEN t.uh END AS unique_hold,
                t.md AS metadata,
                {{schema}}.valid_job(t.ord, t.k, t.p, t.q, t.ra, t.d, t.pr, t.ma, t.uk, payload_limit)
                    AND (unique_scopes IS NULL AND unique_holds IS NULL AND unique_periods IS NULL
                        OR {{schema}}.valid_unique(t.ord, t.us, t.uh, t.up)) AS valid
            FROM ROWS FROM (pg_catalog.unnest(kinds), pg_catalog.unnest(payloads), pg_catalog.unnest(queues),
                pg_catalog.unnest(run_afters), pg_catalog.unnest(delays), pg_catalog.unnest(priorities),
                pg_catalog.unnest(attempt_limits), pg_catalog.unnest(unique_keys),
                pg_catalog.unnest(unique_scopes), pg_catalog.unnest(unique_holds), pg_catalog.unnest(unique_periods),
                pg_catalog.unnest(metadatas))
                WITH ORDINALITY AS t(k, p, q, ra, d, pr, ma, uk, us, uh, up, md, ord)
            WHERE todo IS NULL OR t.ord = ANY (todo)
            ORDER BY t.ord
        ), ins AS (
            INSERT INTO {{schema}}.jobs AS j (id, queue, kind, payload, priority, run_after, max_attempts, unique_key, unique_scope, unique_hold, metadata)
            SELECT i.id, i.queue, i.kind, i.payload, i.priority::smallint, i.run_after, i.max_attempts, i.unique_key, i.unique_scope, i.unique_hold,
                i.metadata
            FROM input i WHERE i.valid
                AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                        WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                    OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
            ORDER BY i.ord
            ON CONFLICT DO NOTHING
            RETURNING j.id, j.queue, j.kind, j.run_after
        ), ev AS (
            INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
            SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after)
            FROM ins x ORDER BY x.id
        ), wake AS (
            -- One wake-up per queue a worker sleeps on: the queue, plus
            -- "|<ms>" when its earliest new job is that far in the future.
            SELECT pg_catalog.pg_notify({{wake_channel}}, x.queue || CASE WHEN pg_catalog.min(x.run_after) > pg_catalog.clock_timestamp()
                THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM pg_catalog.min(x.run_after) - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
                ELSE '' END)
            FROM ins x GROUP BY x.queue HAVING {{schema}}.wake_needed(x.queue)
        )
        SELECT pg_catalog.array_agg(i.ord ORDER BY i.ord) FILTER (WHERE x.id IS NULL),
            pg_catalog.array_agg(i.ord ORDER BY i.ord) FILTER (WHERE x.id IS NOT NULL),
            pg_catalog.array_agg(i.id ORDER BY i.ord),
            pg_catalog.array_agg(i.id ORDER BY i.ord) FILTER (WHERE x.id IS NOT NULL),
            (SELECT pg_catalog.count(*) FROM wake)
        INTO missing, inserted, all_ids, new_ids, woke
        FROM input i LEFT JOIN ins x ON x.id = i.id;
        IF round = 0 AND NOT partial THEN
            ids := all_ids;
            duplicates := pg_catalog.array_fill(false, ARRAY[n]);
            IF missing IS NULL THEN
                RETURN; -- everything inserted: the usual case
            END IF;
        ELSE
            -- A later round (or a call with keys held for a period)
            -- inserted only the inputs in todo.
            FOR k IN 1 .. coalesce(pg_catalog.cardinality(inserted), 0) LOOP
                ids[inserted[k]] := new_ids[k];
            END LOOP;
            EXIT WHEN missing IS NULL;
        END IF;
        -- The inputs whose key is held: the holder's id. A holder that
        -- finished since the insert leaves its input for the next round.
        todo := NULL;
        FOR r IN SELECT m.o, {{schema}}.unique_holder(unique_scopes[m.o] IS DISTINCT FROM 'queue',
                    CASE WHEN unique_scopes[m.o] = 'queue' THEN coalesce(queues[m.o], 'default') ELSE kinds[m.o] END,
                    unique_keys[m.o]) AS holder
                FROM pg_catalog.unnest(missing) AS m(o) LOOP
            IF r.holder IS NULL THEN
                todo := todo || r.o;
            ELSE
                ids[r.o] := r.holder;
                duplicates[r.o] := true;
            END IF;
        END LOOP;
        EXIT WHEN todo IS NULL;
        round := round + 1;
        IF round = 5 THEN
            RAISE EXCEPTION USING ERRCODE = '40001',
                MESSAGE = 'pgwake: enqueue: unique keys kept changing state; gave up after 5 rounds';
        END IF;
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.job_error(bigint, text, jsonb, text, timestamptz, interval, integer, integer, text, integer)
FROM PUBLIC;
