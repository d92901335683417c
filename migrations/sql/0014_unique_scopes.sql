-- Unique keys with a scope and a hold (docs/unique.md). Until now a unique
-- key was one namespace per schema, across kinds and queues: a job of
-- another kind with the same key was silently dropped. A key is now scoped
-- by the job's kind (the default) or its queue, and held while the job is
-- pending and not yet tried (hold 'pending'), while it is pending or running
-- (hold 'active', the default), until it failed or was cancelled (hold
-- 'succeeded': a job that succeeded keeps it until retention deletes it),
-- or for a period from the enqueue whatever becomes of the job (a period:
-- debounce, "at most one per 10 minutes").
--
-- Jobs also get a metadata column (jsonb, NULL when empty): string pairs
-- set at enqueue (queue.NewJob.Metadata, queue.Hooks) and handed to the
-- handler with the job; otelpgwake keeps the producer's trace context there.
--
-- New errors of the SQL API: PW009 unique_scope, PW010 unique_hold /
-- unique_period, PW011 retry of a job whose unique key is held by another
-- job (the holder's id in DETAIL).
--
-- enqueue_jobs, enqueue and enqueue_many take the new parameters, so they
-- are dropped and created again; the EXECUTE grants they had are copied to
-- the new functions.
-- {{schema}} is the quoted schema name, {{wake_channel}} its NOTIFY channel.

CREATE TEMP TABLE pgwake_0014_grants ON COMMIT DROP AS
SELECT p.proname::text AS fn, a.grantee::regrole::text AS grantee
FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
WHERE p.pronamespace = '{{schema}}'::regnamespace
  AND p.proname IN ('enqueue_jobs', 'enqueue', 'enqueue_many')
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

-- NULL scope: the kind; 'queue': the queue. NULL hold: 'active'.
ALTER TABLE {{schema}}.jobs
    ADD COLUMN unique_scope text CONSTRAINT jobs_unique_scope_check CHECK (unique_scope = 'queue'),
    ADD COLUMN unique_hold  text CONSTRAINT jobs_unique_hold_check CHECK (unique_hold IN ('pending', 'succeeded', 'period')),
    ADD COLUMN metadata     jsonb;

-- One index for every scope and hold: a key is held by the jobs the
-- predicate lists. unique_holder repeats the predicate word for word.
DROP INDEX {{schema}}.jobs_unique_key_idx;
CREATE UNIQUE INDEX jobs_unique_key_idx ON {{schema}}.jobs
    ((unique_scope IS NULL), (CASE WHEN unique_scope IS NULL THEN kind ELSE queue END), unique_key)
    WHERE unique_key IS NOT NULL AND (
        (unique_hold IS NULL AND state IN ('pending', 'running'))
        OR (unique_hold = 'pending' AND state = 'pending' AND attempts = 0)
        OR (unique_hold = 'succeeded' AND state IN ('pending', 'running', 'succeeded')));

-- unique_holder is the job holding key in a scope (by_kind: scope_value is
-- a kind, else a queue), or NULL.
CREATE FUNCTION {{schema}}.unique_holder(by_kind boolean, scope_value text, key text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT j.id FROM {{schema}}.jobs j
WHERE (j.unique_scope IS NULL) = $1 AND (CASE WHEN j.unique_scope IS NULL THEN j.kind ELSE j.queue END) = $2
    AND j.unique_key = $3 AND j.unique_key IS NOT NULL AND (
        (j.unique_hold IS NULL AND j.state IN ('pending', 'running'))
        OR (j.unique_hold = 'pending' AND j.state = 'pending' AND j.attempts = 0)
        OR (j.unique_hold = 'succeeded' AND j.state IN ('pending', 'running', 'succeeded')))
LIMIT 1
$$;

-- A key held for a period: one row per scope and key, taken over by the
-- next enqueue once held_until has passed. Retention deletes expired rows.
CREATE TABLE {{schema}}.unique_periods (
    slot       text        PRIMARY KEY, -- 'kind' or 'queue', the kind or queue, the key; separated by U+001F
    job_id     bigint      NOT NULL,
    held_until timestamptz NOT NULL
);
CREATE INDEX unique_periods_held_until_idx ON {{schema}}.unique_periods (held_until);

-- valid_unique raises PW009 or PW010 for a bad scope, hold or period.
CREATE FUNCTION {{schema}}.valid_unique(ord bigint, scope text, hold text, period interval) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(scope, '') NOT IN ('', 'kind', 'queue') THEN
        RETURN {{schema}}.invalid('PW009', ord, 'unique_scope', pg_catalog.format('invalid unique scope %L: use kind or queue', scope));
    ELSIF coalesce(hold, '') NOT IN ('', 'active', 'pending', 'succeeded', 'period') THEN
        RETURN {{schema}}.invalid('PW010', ord, 'unique_hold', pg_catalog.format('invalid unique hold %L: use active, pending, succeeded or period', hold));
    ELSIF period IS NOT NULL AND coalesce(hold, '') NOT IN ('', 'period') THEN
        RETURN {{schema}}.invalid('PW010', ord, 'unique_period', pg_catalog.format('a unique period holds the key for the period: it cannot be combined with hold %L', hold));
    ELSIF period IS NULL AND hold = 'period' THEN
        RETURN {{schema}}.invalid('PW010', ord, 'unique_period', 'hold period needs a unique_period');
    ELSIF period IS NOT NULL AND NOT (period > interval '0' AND period < interval '100 years') THEN
        RETURN {{schema}}.invalid('PW010', ord, 'unique_period', pg_catalog.format('invalid unique period %s: must be positive and finite', period));
    END IF;
    RETURN true;
END
$$;

DROP FUNCTION {{schema}}.enqueue_many(jsonb);
DROP FUNCTION {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text);
DROP FUNCTION {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer);

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
CREATE FUNCTION {{schema}}.enqueue_jobs(
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
            FROM input i WHERE i.valid ORDER BY i.ord
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

-- enqueue enqueues one job and returns its id (or, when unique_key is held,
-- the holder's id, writing nothing). run_after wins over delay; neither
-- means now. unique_scope: kind (default) or queue; unique_hold: active
-- (default), pending, succeeded, or period with unique_period. metadata: a
-- JSON object of strings handed to the handler (e.g. a W3C traceparent).
CREATE FUNCTION {{schema}}.enqueue(
    kind          text,
    payload       jsonb       DEFAULT '{}',
    queue         text        DEFAULT 'default',
    run_after     timestamptz DEFAULT NULL,
    delay         interval    DEFAULT NULL,
    priority      integer     DEFAULT 0,
    max_attempts  integer     DEFAULT 5,
    unique_key    text        DEFAULT NULL,
    unique_scope  text        DEFAULT NULL,
    unique_hold   text        DEFAULT NULL,
    unique_period interval    DEFAULT NULL,
    metadata      jsonb       DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: its plans are cached for the session.
    IF unique_scope IS NULL AND unique_hold IS NULL AND unique_period IS NULL AND metadata IS NULL THEN
        RETURN ({{schema}}.enqueue_jobs(ARRAY[kind], ARRAY[payload], ARRAY[queue], ARRAY[run_after], ARRAY[delay],
            ARRAY[priority], ARRAY[max_attempts], ARRAY[unique_key])).ids[1];
    END IF;
    RETURN ({{schema}}.enqueue_jobs(ARRAY[kind], ARRAY[payload], ARRAY[queue], ARRAY[run_after], ARRAY[delay],
        ARRAY[priority], ARRAY[max_attempts], ARRAY[unique_key], 1048576,
        ARRAY[unique_scope], ARRAY[unique_hold], ARRAY[unique_period], ARRAY[metadata])).ids[1];
END
$$;

-- enqueue_many enqueues a JSON array of job objects (keys: kind, payload,
-- queue, run_after, delay, priority, max_attempts, unique_key, unique_scope,
-- unique_hold, unique_period, metadata) in one statement with one wake-up per queue.
-- It returns the ids in input order, as enqueue does.
CREATE FUNCTION {{schema}}.enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
    result_ids bigint[];
    known constant text[] := ARRAY['kind', 'payload', 'queue', 'run_after', 'delay', 'priority', 'max_attempts',
        'unique_key', 'unique_scope', 'unique_hold', 'unique_period', 'metadata'];
BEGIN
    IF jobs IS NULL OR pg_catalog.jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = pg_catalog.format('pgwake: enqueue_many: want a JSON array of job objects, got %s', coalesce(pg_catalog.jsonb_typeof(jobs), 'NULL'));
    END IF;
    SELECT e.ord, pg_catalog.jsonb_typeof(e.job) AS type,
        (SELECT k FROM pg_catalog.jsonb_object_keys(CASE WHEN pg_catalog.jsonb_typeof(e.job) = 'object' THEN e.job END) k
         WHERE k <> ALL (known) LIMIT 1) AS key
    INTO bad
    FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord)
    WHERE pg_catalog.jsonb_typeof(e.job) <> 'object'
       OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(CASE WHEN pg_catalog.jsonb_typeof(e.job) = 'object' THEN e.job END) k
                  WHERE k <> ALL (known))
    ORDER BY e.ord LIMIT 1;
    IF FOUND THEN
        IF bad.type <> 'object' THEN
            PERFORM {{schema}}.invalid('PW008', bad.ord, 'job', pg_catalog.format('want a JSON object, got %s', bad.type));
        END IF;
        PERFORM {{schema}}.invalid('PW008', bad.ord, bad.key, 'unknown key; use ' || pg_catalog.array_to_string(known, ', '));
    END IF;
    SELECT r.ids INTO result_ids
    FROM {{schema}}.enqueue_jobs(
        ARRAY(SELECT {{schema}}.json_text(e.job, 'kind', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT e.job -> 'payload' FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT {{schema}}.json_text(e.job, 'queue', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT CASE WHEN e.job ? 'run_after' THEN {{schema}}.json_time(e.job, 'run_after', e.ord) END FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT CASE WHEN e.job ? 'delay' THEN {{schema}}.json_interval(e.job, 'delay', e.ord) END FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT {{schema}}.json_int(e.job, 'priority', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT {{schema}}.json_int(e.job, 'max_attempts', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT {{schema}}.json_text(e.job, 'unique_key', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        1048576,
        ARRAY(SELECT {{schema}}.json_text(e.job, 'unique_scope', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT {{schema}}.json_text(e.job, 'unique_hold', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT CASE WHEN e.job ? 'unique_period' THEN {{schema}}.json_interval(e.job, 'unique_period', e.ord) END FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT e.job -> 'metadata' FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord)) r;
    RETURN result_ids;
END
$$;

-- retry puts a failed job back to pending, due now, with a retried event and
-- a wake-up; its attempts are kept and max_attempts grows by one if needed.
-- False when the job is not failed; PW011 when its unique key is held by
-- another job now (the holder's id in DETAIL).
CREATE OR REPLACE FUNCTION {{schema}}.retry(id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ok     boolean;
    holder bigint;
BEGIN
    WITH j AS (
        UPDATE {{schema}}.jobs SET state = 'pending', run_after = pg_catalog.now(), finished_at = NULL,
            max_attempts = GREATEST(max_attempts, attempts + 1)
        WHERE id = retry.id AND state = 'failed'
        RETURNING id, queue, kind, attempts, run_after
    ), ev AS (
        INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
        SELECT x.id, 'retried', x.queue, x.kind, x.attempts, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM j x
    ), wake AS (
        SELECT pg_catalog.pg_notify({{wake_channel}}, x.queue) FROM j x
    )
    SELECT EXISTS (SELECT 1 FROM j) AND (SELECT pg_catalog.count(*) FROM wake) >= 0 INTO ok;
    RETURN ok;
EXCEPTION WHEN unique_violation THEN
    SELECT {{schema}}.unique_holder(x.unique_scope IS NULL, CASE WHEN x.unique_scope IS NULL THEN x.kind ELSE x.queue END, x.unique_key)
    INTO holder FROM {{schema}}.jobs x WHERE x.id = retry.id;
    RAISE EXCEPTION USING ERRCODE = 'PW011', COLUMN = 'unique_key', DETAIL = coalesce(holder::text, ''),
        MESSAGE = pg_catalog.format('pgwake: retry job %s: its unique key is held by job %s', retry.id, coalesce(holder::text, '(finished since)'));
END
$$;

REVOKE EXECUTE ON FUNCTION
    {{schema}}.unique_holder(boolean, text, text),
    {{schema}}.valid_unique(bigint, text, text, interval),
    {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer, text[], text[], interval[], jsonb[]),
    {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text, text, text, interval, jsonb),
    {{schema}}.enqueue_many(jsonb)
FROM PUBLIC;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT fn, grantee FROM pg_temp.pgwake_0014_grants LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s',
            CASE g.fn
                WHEN 'enqueue_jobs' THEN '{{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer, text[], text[], interval[], jsonb[])'
                WHEN 'enqueue' THEN '{{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text, text, text, interval, jsonb)'
                ELSE '{{schema}}.enqueue_many(jsonb)' END,
            g.grantee);
    END LOOP;
END
$$;
