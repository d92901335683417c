-- Bounds of the SQL API's input that the Go client already keeps (found by
-- an adversarial review, 2026-12-03):
--
-- * run_after outside years 1 to 9999 (UTC), '20000-01-01' or a date BC:
--   the job was written, its enqueued event then failed to decode in the
--   event stream (skipped) and in Verify, Rebuild and replay (the whole
--   log), and jobs list --json failed. Now PW005 on run_after.
-- * a delay that puts run_after past year 9999 ('300000 years') raised
--   22008 "timestamp out of range" without the field. Now PW005 on delay.
-- * metadata {"a": ["x"]} passed metadata_ok: jsonpath's lax mode unwraps
--   arrays before the filter. Now strict: PW012.
-- * enqueue_jobs with one job read element [1] of each array: an array
--   starting at another index ('[0:0]={7}') was taken as NULL (the
--   default) without an error, and a two-dimensional one was flattened.
--   Now PW008 unless every array is one-dimensional from index 1.
-- * a transaction that enqueued could not be PREPAREd (two-phase commit,
--   XA) when the enqueue sent a NOTIFY, which it does whenever a worker is
--   idle on the queue and always under REPEATABLE READ or SERIALIZABLE.
--   SET LOCAL pgwake.no_notify = on now makes the enqueues of the
--   transaction send none (nor take the wake-up's advisory lock): the
--   workers' poll finds the jobs.
-- {{schema}} is the quoted schema name, {{wake_channel}} its NOTIFY
-- channel, {{events_notify_guc}} the name of the setting as a literal.

-- valid_job: migration 0019's, with run_after within years 1 to 9999 and
-- a delay below 7000 years on the fast path; a longer delay goes to
-- job_error, which computes where it lands.
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
        AND (ra IS NULL OR (ra OPERATOR(pg_catalog.>=) '0001-01-01 00:00:00+00'::pg_catalog.timestamptz
            AND ra OPERATOR(pg_catalog.<) '10000-01-01 00:00:00+00'::pg_catalog.timestamptz))
        AND (ra IS NOT NULL OR d IS NULL OR (pg_catalog.isfinite(d) AND d OPERATOR(pg_catalog.>=) interval '0'
            AND d OPERATOR(pg_catalog.<) interval '7000 years'))
        AND (ma IS NULL OR ma OPERATOR(pg_catalog.>=) 1)
        AND (uk IS NULL OR pg_catalog.octet_length(uk) OPERATOR(pg_catalog.<=) 1024)
    THEN true
    ELSE {{schema}}.job_error(ord, k, p, q, ra, d, pr, ma, uk, payload_limit) END
$$;

-- job_error: migration 0019's, with the bounds above.
CREATE OR REPLACE FUNCTION {{schema}}.job_error(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
    pr integer, ma integer, uk text, payload_limit integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lands timestamptz;
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
    ELSIF ra IS NOT NULL AND (ra < '0001-01-01 00:00:00+00' OR ra >= '10000-01-01 00:00:00+00') THEN
        RETURN {{schema}}.invalid('PW005', ord, 'run_after', pg_catalog.format('invalid schedule: run_after %s is outside years 1 to 9999 (UTC)', ra));
    ELSIF ra IS NULL AND d IS NOT NULL AND (NOT pg_catalog.isfinite(d) OR d < interval '0') THEN
        RETURN {{schema}}.invalid('PW005', ord, 'delay', pg_catalog.format('invalid schedule: delay %s is negative or infinite', d));
    ELSIF ma IS NOT NULL AND ma < 1 THEN
        RETURN {{schema}}.invalid('PW006', ord, 'max_attempts', pg_catalog.format('max attempts must be at least 1: got %s', ma));
    ELSIF uk IS NOT NULL AND pg_catalog.octet_length(uk) > 1024 THEN
        RETURN {{schema}}.invalid('PW007', ord, 'unique_key', pg_catalog.format('invalid unique key: %s bytes, the limit is 1024', pg_catalog.octet_length(uk)));
    END IF;
    IF ra IS NULL AND d IS NOT NULL THEN
        BEGIN
            lands := pg_catalog.now() + d;
        EXCEPTION WHEN datetime_field_overflow THEN
            lands := 'infinity';
        END;
        IF lands >= '10000-01-01 00:00:00+00' THEN
            RETURN {{schema}}.invalid('PW005', ord, 'delay', pg_catalog.format('invalid schedule: delay %s puts run_after past year 9999', d));
        END IF;
    END IF;
    RETURN true;
END
$$;

-- metadata_ok: migration 0022's, strict (lax mode unwrapped arrays).
CREATE OR REPLACE FUNCTION {{schema}}.metadata_ok(m jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
SELECT m IS NULL OR pg_catalog.jsonb_typeof(m) OPERATOR(pg_catalog.=) 'null'
    OR (pg_catalog.jsonb_typeof(m) OPERATOR(pg_catalog.=) 'object'
        AND NOT pg_catalog.jsonb_path_exists(m, 'strict $.* ? (@.type() != "string")'))
$$;

-- one_based: true when a is NULL, empty, or one-dimensional from index 1.
CREATE FUNCTION {{schema}}.one_based(a anyarray) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
SELECT a IS NULL OR pg_catalog.array_ndims(a) IS NULL
    OR (pg_catalog.array_ndims(a) OPERATOR(pg_catalog.=) 1 AND pg_catalog.array_lower(a, 1) OPERATOR(pg_catalog.=) 1)
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.one_based(anyarray) FROM PUBLIC;

-- enqueue_jobs: migration 0020's, with the arrays' shape checked first, a
-- scope, hold or period without a key refused (PW007 on unique_key; it was
-- written, the Go client refuses it), each row's check before its
-- run_after is computed (a delay of 300000 years in a batch raised 22008),
-- and unique keys taken in key order (two batches with the same keys in
-- opposite orders deadlocked).
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
    one_queue text;
    one_run_after timestamptz;
    one_key  bigint;
    notify   boolean;
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
    o        integer;
    keyless  integer;
BEGIN
    IF n = 0 THEN
        ids := '{}';
        duplicates := '{}';
        held_until := '{}';
        RETURN;
    END IF;
    IF NOT ({{schema}}.one_based(kinds) AND {{schema}}.one_based(payloads) AND {{schema}}.one_based(queues)
            AND {{schema}}.one_based(run_afters) AND {{schema}}.one_based(delays) AND {{schema}}.one_based(priorities)
            AND {{schema}}.one_based(attempt_limits) AND {{schema}}.one_based(unique_keys) AND {{schema}}.one_based(unique_scopes)
            AND {{schema}}.one_based(unique_holds) AND {{schema}}.one_based(unique_periods) AND {{schema}}.one_based(metadatas)) THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = 'pgwake: enqueue_jobs: every array must be one-dimensional and start at index 1';
    END IF;
    IF unique_scopes IS NOT NULL OR unique_holds IS NOT NULL OR unique_periods IS NOT NULL THEN
        -- A scope, hold or period needs a key, as the Go client says.
        SELECT pg_catalog.min(s.o) INTO keyless FROM pg_catalog.generate_series(1, n) s(o)
        WHERE coalesce(unique_keys[s.o], '') = ''
            AND (unique_scopes[s.o] IS NOT NULL OR unique_holds[s.o] IS NOT NULL OR unique_periods[s.o] IS NOT NULL);
        IF keyless IS NOT NULL THEN
            PERFORM {{schema}}.invalid('PW007', keyless, 'unique_key', 'a unique scope, hold or period needs a unique key');
        END IF;
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
        END LOOP;
        -- The slots in the order of their names, not the input's: two calls
        -- with the same keys wait for each other instead of deadlocking.
        FOR o IN SELECT s.o FROM pg_catalog.generate_series(1, n) s(o)
                WHERE unique_periods[s.o] IS NOT NULL AND coalesce(unique_keys[s.o], '') <> ''
                ORDER BY CASE WHEN unique_scopes[s.o] = 'queue' THEN 'queue' || chr(31) || coalesce(queues[s.o], 'default')
                    ELSE 'kind' || chr(31) || kinds[s.o] END || chr(31) || unique_keys[s.o], s.o LOOP
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
        IF coalesce(unique_keys[1], '') = '' THEN
            -- No unique key: nothing for ON CONFLICT to arbitrate (the id
            -- is the sequence's), so a plain INSERT, without the
            -- speculative insertion's index probe and confirm record.
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
                    -- events trigger queues no commit-time call (migration 0019).
                    AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                            WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                        OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
                RETURNING j.id, j.queue, j.kind, j.run_after
            ), ev AS (
                INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
                SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM ins x
            )
            SELECT x.id, x.queue, x.run_after,
                (SELECT s.salt FROM {{schema}}.wake_salt s) # (pg_catalog.hashtextextended(x.queue, 0::bigint) & 255::bigint)
            INTO one_id, one_queue, one_run_after, one_key FROM ins x;
        ELSE
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
                    -- events trigger queues no commit-time call (migration 0019).
                    AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                            WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                        OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
                ON CONFLICT DO NOTHING
                RETURNING j.id, j.queue, j.kind, j.run_after
            ), ev AS (
                INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
                SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM ins x
            )
            SELECT x.id, x.queue, x.run_after,
                (SELECT s.salt FROM {{schema}}.wake_salt s) # (pg_catalog.hashtextextended(x.queue, 0::bigint) & 255::bigint)
            INTO one_id, one_queue, one_run_after, one_key FROM ins x;
        END IF;
        IF one_id IS NOT NULL THEN
            -- wake_needed(one_queue), inline (migration 0006's protocol):
            -- each condition is its own expression, evaluated with a
            -- snapshot of its own, so the look at the waiters is taken
            -- after the shared lock is held. one_key is wake_lock_key().
            IF pg_catalog.current_setting('pgwake.no_notify', true) = 'on' THEN
                notify := false; -- the transaction may be PREPAREd: the workers' poll finds the job
            ELSIF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                notify := true;
            ELSIF NOT pg_catalog.pg_try_advisory_xact_lock_shared(one_key) THEN
                notify := true;
            ELSE
                notify := EXISTS (SELECT 1 FROM {{schema}}.waiters w
                    WHERE w.queue = one_queue AND w.idle AND w.heartbeat_at > pg_catalog.now() - interval '90 seconds');
            END IF;
            IF notify THEN
                PERFORM pg_catalog.pg_notify({{wake_channel}}, one_queue || CASE WHEN one_run_after > pg_catalog.clock_timestamp()
                    THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM one_run_after - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
                    ELSE '' END);
            END IF;
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
            SELECT -- valid first: it raises before run_after's sum can overflow
                {{schema}}.valid_job(t.ord, t.k, t.p, t.q, t.ra, t.d, t.pr, t.ma, t.uk, payload_limit)
                    AND (unique_scopes IS NULL AND unique_holds IS NULL AND unique_periods IS NULL
                        OR {{schema}}.valid_unique(t.ord, t.us, t.uh, t.up)) AS valid,
                t.ord::integer AS ord, coalesce(preset[t.ord], pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass)) AS id,
                coalesce(t.q, 'default') AS queue, t.k AS kind, coalesce(t.p, '{}'::jsonb) AS payload,
                coalesce(t.pr, 0) AS priority,
                coalesce(t.ra, pg_catalog.now() + coalesce(t.d, interval '0')) AS run_after,
                coalesce(t.ma, 5) AS max_attempts, nullif(t.uk, '') AS unique_key,
                CASE WHEN t.us = 'queue' THEN 'queue' END AS unique_scope,
                CASE WHEN t.up IS NOT NULL THEN 'period' WHEN t.uh IN ('pending', 'succeeded') THEN t.uh END AS unique_hold,
                t.md AS metadata
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
            -- Keys in one order whatever the input's (ids are the input's):
            -- two calls with the same keys wait for each other instead of
            -- deadlocking.
            ORDER BY i.unique_key, i.kind, i.queue, i.ord
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

-- wake_needed: migration 0010's, false under pgwake.no_notify.
CREATE OR REPLACE FUNCTION {{schema}}.wake_needed(q text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('pgwake.no_notify', true) OPERATOR(pg_catalog.=) 'on' THEN
        RETURN false;
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RETURN true;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared((SELECT s.salt FROM {{schema}}.wake_salt s)
            OPERATOR(pg_catalog.#) (pg_catalog.hashtextextended(q, 0::bigint) OPERATOR(pg_catalog.&) 255::bigint)) THEN
        RETURN true;
    END IF;
    RETURN EXISTS (
        SELECT 1 FROM {{schema}}.waiters w
        WHERE w.queue OPERATOR(pg_catalog.=) q AND w.idle
          AND w.heartbeat_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '90 seconds'));
END
$$;

-- enqueue_one: migration 0021's, without a wake-up under pgwake.no_notify,
-- and a priority out of range raising PW004 (it raised 22003, "smallint out
-- of range", without the field: the cast was folded into the plan before
-- the check ran).
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_one(
    kind          text,
    payload       jsonb       DEFAULT NULL,
    queue         text        DEFAULT NULL,
    run_after     timestamptz DEFAULT NULL,
    delay         interval    DEFAULT NULL,
    priority      integer     DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    metadata      jsonb       DEFAULT NULL,
    payload_limit integer     DEFAULT 1048576
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    one_id        bigint;
    one_queue     text;
    one_run_after timestamptz;
    one_key       bigint;
    notify        boolean;
BEGIN
    WITH ins AS (
        INSERT INTO {{schema}}.jobs AS j (queue, kind, payload, priority, run_after, max_attempts, metadata)
        SELECT coalesce(enqueue_one.queue, 'default'), enqueue_one.kind, coalesce(enqueue_one.payload, '{}'::jsonb),
            -- Cast only in range: a custom plan folds the cast of the
            -- argument, which raised 22003 before valid_job's PW004.
            coalesce(CASE WHEN enqueue_one.priority BETWEEN -32768 AND 32767 THEN enqueue_one.priority END, 0)::smallint,
            coalesce(enqueue_one.run_after, pg_catalog.now() + coalesce(enqueue_one.delay, interval '0')),
            coalesce(enqueue_one.max_attempts, 5), enqueue_one.metadata
        WHERE {{schema}}.valid_job(1, enqueue_one.kind, enqueue_one.payload, enqueue_one.queue, enqueue_one.run_after,
                enqueue_one.delay, enqueue_one.priority, enqueue_one.max_attempts, NULL, enqueue_one.payload_limit)
            -- No event watcher: mark the transaction so that the events
            -- trigger queues no commit-time call (migration 0019).
            AND (EXISTS (SELECT 1 FROM {{schema}}.event_watchers w
                    WHERE w.seen_at > pg_catalog.now() - interval '60 seconds')
                OR pg_catalog.set_config({{events_notify_guc}}, 'queued', true) IS NOT NULL)
        RETURNING j.id, j.queue, j.kind, j.run_after
    ), ev AS (
        INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
        SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after) FROM ins x
    )
    SELECT x.id, x.queue, x.run_after,
        (SELECT s.salt FROM {{schema}}.wake_salt s) # (pg_catalog.hashtextextended(x.queue, 0::bigint) & 255::bigint)
    INTO one_id, one_queue, one_run_after, one_key FROM ins x;
    -- wake_needed(one_queue), inline, as in enqueue_jobs (migration 0020).
    IF pg_catalog.current_setting('pgwake.no_notify', true) = 'on' THEN
        notify := false; -- the transaction may be PREPAREd: the workers' poll finds the job
    ELSIF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        notify := true;
    ELSIF NOT pg_catalog.pg_try_advisory_xact_lock_shared(one_key) THEN
        notify := true;
    ELSE
        notify := EXISTS (SELECT 1 FROM {{schema}}.waiters w
            WHERE w.queue = one_queue AND w.idle AND w.heartbeat_at > pg_catalog.now() - interval '90 seconds');
    END IF;
    IF notify THEN
        PERFORM pg_catalog.pg_notify({{wake_channel}}, one_queue || CASE WHEN one_run_after > pg_catalog.clock_timestamp()
            THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM one_run_after - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
            ELSE '' END);
    END IF;
    RETURN one_id;
END
$$;
