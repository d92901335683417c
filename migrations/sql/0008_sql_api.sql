-- The SQL API (docs/sql.md): enqueue, enqueue_many, cancel and retry for any
-- PostgreSQL client, in the caller's transaction, with what queue.EnqueueTx
-- does: the job, its enqueued event, a wake-up when a worker sleeps on the
-- queue, validation that writes nothing. enqueue_jobs is the one
-- implementation: the Go client calls it too.
--
-- The API's functions (enqueue_jobs, enqueue, enqueue_many, cancel_jobs,
-- cancel, retry) are SECURITY DEFINER: they run as the owner of pgwake's
-- tables, so a producer needs EXECUTE and no table privilege. Every function
-- here has its search_path pinned to pg_catalog, pg_temp: no function,
-- operator or table a caller creates elsewhere is ever resolved in them.
-- EXECUTE on all of them is revoked from PUBLIC; docs/grants.sql grants it.
--
-- Errors (SQLSTATE class PW, message "pgwake: job N: field: ...", the field
-- also in the error's COLUMN):
--   PW001 kind, PW002 queue, PW003 payload, PW004 priority,
--   PW005 run_after / delay, PW006 max_attempts, PW007 unique_key,
--   PW008 enqueue_many's argument (not an array of objects, unknown key, a
--   value of the wrong JSON type) or enqueue_jobs' arrays of unequal length.
-- {{wake_channel}} is the schema's NOTIFY channel as a literal.

-- invalid raises one of the errors above (it never returns: boolean so that
-- a CASE can call it).
CREATE FUNCTION {{schema}}.invalid(code text, ord bigint, field text, msg text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, COLUMN = field,
        MESSAGE = pg_catalog.format('pgwake: job %s: %s: %s', ord - 1, field, msg);
END
$$;

-- valid_job checks job ord (from 1) field by field in queue.NewJob's order
-- and raises the first error; true when the job is valid.
CREATE FUNCTION {{schema}}.valid_job(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
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

-- enqueue_jobs enqueues the jobs given column-wise (element i of every
-- array is job i; a NULL array or element takes the default) and returns,
-- in input order, each job's id and whether its unique key was held by an
-- unfinished job (then the id is that job's and nothing was written for
-- it). payload_limit bounds each payload's JSON text as PostgreSQL prints
-- it, in bytes (NULL: no bound; the Go client checks its own
-- Config.MaxPayloadBytes on the text it sends).
--
-- One job (enqueue, the Go client's Enqueue) takes a plain INSERT with
-- VALUES; more take the same statement over unnest. Either way the usual
-- call is one statement: the jobs are checked (valid_job) row by row as they
-- are inserted, so an invalid job raises before the statement ends and
-- everything it wrote goes with it. Generic plans: planning the statement
-- anew on every call would cost more than running it.
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
    OUT ids        bigint[],
    OUT duplicates boolean[]
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
    woke     bigint;
    round    integer := 0;
    r        record;
BEGIN
    IF n = 0 THEN
        ids := '{}';
        duplicates := '{}';
        RETURN;
    END IF;
    IF (payloads IS NOT NULL AND pg_catalog.cardinality(payloads) <> n)
        OR (queues IS NOT NULL AND pg_catalog.cardinality(queues) <> n)
        OR (run_afters IS NOT NULL AND pg_catalog.cardinality(run_afters) <> n)
        OR (delays IS NOT NULL AND pg_catalog.cardinality(delays) <> n)
        OR (priorities IS NOT NULL AND pg_catalog.cardinality(priorities) <> n)
        OR (attempt_limits IS NOT NULL AND pg_catalog.cardinality(attempt_limits) <> n)
        OR (unique_keys IS NOT NULL AND pg_catalog.cardinality(unique_keys) <> n) THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = 'pgwake: enqueue_jobs: every array must be NULL or as long as kinds';
    END IF;
    WHILE n = 1 LOOP
        WITH ins AS (
            INSERT INTO {{schema}}.jobs AS j (queue, kind, payload, priority, run_after, max_attempts, unique_key)
            SELECT coalesce(queues[1], 'default'), kinds[1], coalesce(payloads[1], '{}'::jsonb), coalesce(priorities[1], 0)::smallint,
                coalesce(run_afters[1], pg_catalog.now() + coalesce(delays[1], interval '0')), coalesce(attempt_limits[1], 5),
                nullif(unique_keys[1], '')
            WHERE {{schema}}.valid_job(1, kinds[1], payloads[1], queues[1], run_afters[1], delays[1],
                priorities[1], attempt_limits[1], unique_keys[1], payload_limit)
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running') DO NOTHING
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
        SELECT j.id INTO one_id FROM {{schema}}.jobs j
        WHERE j.unique_key = unique_keys[1] AND j.state IN ('pending', 'running');
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
        -- Ids come from the jobs' sequence in input order, so rows map back
        -- to their input and claim order follows input order. Each job is
        -- checked field by field in queue.NewJob's order. A unique key held
        -- by an unfinished job inserts nothing for that input.
        WITH input AS MATERIALIZED (
            SELECT t.ord::integer AS ord, pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass) AS id,
                coalesce(t.q, 'default') AS queue, t.k AS kind, coalesce(t.p, '{}'::jsonb) AS payload,
                coalesce(t.pr, 0) AS priority,
                coalesce(t.ra, pg_catalog.now() + coalesce(t.d, interval '0')) AS run_after,
                coalesce(t.ma, 5) AS max_attempts, nullif(t.uk, '') AS unique_key,
                {{schema}}.valid_job(t.ord, t.k, t.p, t.q, t.ra, t.d, t.pr, t.ma, t.uk, payload_limit) AS valid
            FROM ROWS FROM (pg_catalog.unnest(kinds), pg_catalog.unnest(payloads), pg_catalog.unnest(queues),
                pg_catalog.unnest(run_afters), pg_catalog.unnest(delays), pg_catalog.unnest(priorities),
                pg_catalog.unnest(attempt_limits), pg_catalog.unnest(unique_keys))
                WITH ORDINALITY AS t(k, p, q, ra, d, pr, ma, uk, ord)
            WHERE todo IS NULL OR t.ord = ANY (todo)
            ORDER BY t.ord
        ), ins AS (
            INSERT INTO {{schema}}.jobs AS j (id, queue, kind, payload, priority, run_after, max_attempts, unique_key)
            SELECT i.id, i.queue, i.kind, i.payload, i.priority::smallint, i.run_after, i.max_attempts, i.unique_key
            FROM input i WHERE i.valid ORDER BY i.ord
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running') DO NOTHING
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
        IF round = 0 THEN
            ids := all_ids;
            duplicates := pg_catalog.array_fill(false, ARRAY[n]);
            IF missing IS NULL THEN
                RETURN; -- everything inserted: the usual case
            END IF;
        ELSE
            -- A later round inserted only the inputs in todo.
            FOR k IN 1 .. coalesce(pg_catalog.cardinality(inserted), 0) LOOP
                ids[inserted[k]] := new_ids[k];
            END LOOP;
            EXIT WHEN missing IS NULL;
        END IF;
        -- The inputs whose key is held: the holder's id. A holder that
        -- finished since the insert leaves its input for the next round.
        todo := NULL;
        FOR r IN SELECT m.o, (SELECT j.id FROM {{schema}}.jobs j WHERE j.unique_key = unique_keys[m.o]
                    AND j.state IN ('pending', 'running')) AS holder
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

-- enqueue enqueues one job and returns its id (or, when unique_key is held
-- by an unfinished job, that job's id, writing nothing). run_after wins over
-- delay; neither means now.
CREATE FUNCTION {{schema}}.enqueue(
    kind         text,
    payload      jsonb       DEFAULT '{}',
    queue        text        DEFAULT 'default',
    run_after    timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 5,
    unique_key   text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: its plans are cached for the session.
    RETURN ({{schema}}.enqueue_jobs(ARRAY[kind], ARRAY[payload], ARRAY[queue], ARRAY[run_after], ARRAY[delay],
        ARRAY[priority], ARRAY[max_attempts], ARRAY[unique_key])).ids[1];
END
$$;

-- json_text, json_int, json_time and json_interval read key of job ord of
-- enqueue_many's argument as the type enqueue takes, or raise PW008 (wrong
-- JSON type), PW004 / PW006 (not a 32-bit integer) or PW005 (a run_after or
-- delay that does not parse).
CREATE FUNCTION {{schema}}.json_text(job jsonb, key text, ord bigint) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF job -> key IS NULL OR pg_catalog.jsonb_typeof(job -> key) = 'null' THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.jsonb_typeof(job -> key) <> 'string' THEN
        PERFORM {{schema}}.invalid('PW008', ord, key, pg_catalog.format('want a JSON string, got %s', pg_catalog.jsonb_typeof(job -> key)));
    END IF;
    RETURN job ->> key;
END
$$;

CREATE FUNCTION {{schema}}.json_int(job jsonb, key text, ord bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v numeric;
BEGIN
    IF job -> key IS NULL OR pg_catalog.jsonb_typeof(job -> key) = 'null' THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.jsonb_typeof(job -> key) <> 'number' THEN
        PERFORM {{schema}}.invalid('PW008', ord, key, pg_catalog.format('want a JSON number, got %s', pg_catalog.jsonb_typeof(job -> key)));
    END IF;
    v := (job ->> key)::numeric;
    IF v <> pg_catalog.trunc(v) OR v < -2147483648 OR v > 2147483647 THEN
        PERFORM {{schema}}.invalid(CASE key WHEN 'priority' THEN 'PW004' ELSE 'PW006' END, ord, key,
            pg_catalog.format('%s is not a 32-bit integer', v));
    END IF;
    RETURN v::integer;
END
$$;

CREATE FUNCTION {{schema}}.json_time(job jsonb, key text, ord bigint) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text := {{schema}}.json_text(job, key, ord);
BEGIN
    RETURN s::timestamptz;
EXCEPTION WHEN data_exception THEN
    PERFORM {{schema}}.invalid('PW005', ord, key, pg_catalog.format('invalid schedule: %L is not a timestamp', s));
END
$$;

CREATE FUNCTION {{schema}}.json_interval(job jsonb, key text, ord bigint) RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text;
BEGIN
    IF pg_catalog.jsonb_typeof(job -> key) = 'number' THEN
        RETURN (job ->> key)::float8 * interval '1 second';
    END IF;
    s := {{schema}}.json_text(job, key, ord);
    RETURN s::interval;
EXCEPTION WHEN data_exception THEN
    PERFORM {{schema}}.invalid('PW005', ord, key, pg_catalog.format('invalid schedule: %L is not an interval', s));
END
$$;

-- enqueue_many enqueues a JSON array of jobs, each an object with enqueue's
-- parameters as keys (delay: an interval string or a number of seconds), in
-- one statement with one wake-up per queue. It returns the ids in input
-- order, as enqueue does.
CREATE FUNCTION {{schema}}.enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
    result_ids bigint[];
BEGIN
    IF jobs IS NULL OR pg_catalog.jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = pg_catalog.format('pgwake: enqueue_many: want a JSON array of job objects, got %s', coalesce(pg_catalog.jsonb_typeof(jobs), 'NULL'));
    END IF;
    SELECT e.ord, pg_catalog.jsonb_typeof(e.job) AS type,
        (SELECT k FROM pg_catalog.jsonb_object_keys(CASE WHEN pg_catalog.jsonb_typeof(e.job) = 'object' THEN e.job END) k
         WHERE k <> ALL (ARRAY['kind', 'payload', 'queue', 'run_after', 'delay', 'priority', 'max_attempts', 'unique_key']) LIMIT 1) AS key
    INTO bad
    FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord)
    WHERE pg_catalog.jsonb_typeof(e.job) <> 'object'
       OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(CASE WHEN pg_catalog.jsonb_typeof(e.job) = 'object' THEN e.job END) k
                  WHERE k <> ALL (ARRAY['kind', 'payload', 'queue', 'run_after', 'delay', 'priority', 'max_attempts', 'unique_key']))
    ORDER BY e.ord LIMIT 1;
    IF FOUND THEN
        IF bad.type <> 'object' THEN
            PERFORM {{schema}}.invalid('PW008', bad.ord, 'job', pg_catalog.format('want a JSON object, got %s', bad.type));
        END IF;
        PERFORM {{schema}}.invalid('PW008', bad.ord, bad.key, 'unknown key; use kind, payload, queue, run_after, delay, priority, max_attempts, unique_key');
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
        ARRAY(SELECT {{schema}}.json_text(e.job, 'unique_key', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord)) r;
    RETURN result_ids;
END
$$;

-- cancel_jobs marks the pending or running jobs among ids cancelled, with
-- their cancelled events, and tells the worker of a running (leased) one
-- ("!cancel|<id>" on the wake channel). It returns the ids it cancelled.
CREATE FUNCTION {{schema}}.cancel_jobs(ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH j AS (
    UPDATE {{schema}}.jobs SET state = 'cancelled', finished_at = pg_catalog.clock_timestamp(), lease_expires_at = NULL
    WHERE id = ANY ($1) AND state IN ('pending', 'running')
    RETURNING id, queue, kind, attempts, leased_by
), a AS (
    DELETE FROM {{schema}}.attempts WHERE job_id IN (SELECT id FROM j)
), ev AS (
    INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt)
    SELECT id, 'cancelled', queue, kind, attempts FROM j ORDER BY id
), tell AS (
    SELECT pg_catalog.pg_notify({{wake_channel}}, '!cancel|' || id::text) FROM j WHERE leased_by IS NOT NULL
)
SELECT id FROM j WHERE (SELECT pg_catalog.count(*) FROM tell) >= 0
$$;

-- cancel cancels one pending or running job; false when there is none.
CREATE FUNCTION {{schema}}.cancel(id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT 1 FROM {{schema}}.cancel_jobs(ARRAY[$1])) $$;

-- retry puts a failed job back to pending, due now, with a retried event and
-- a wake-up; its attempts are kept and max_attempts grows by one if needed.
-- False when the job is not failed.
CREATE FUNCTION {{schema}}.retry(id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH j AS (
    UPDATE {{schema}}.jobs SET state = 'pending', run_after = pg_catalog.now(), finished_at = NULL,
        max_attempts = GREATEST(max_attempts, attempts + 1)
    WHERE id = $1 AND state = 'failed'
    RETURNING id, queue, kind, attempts, run_after
), ev AS (
    INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
    SELECT id, 'retried', queue, kind, attempts, pg_catalog.jsonb_build_object('run_after', run_after) FROM j
), wake AS (
    SELECT pg_catalog.pg_notify({{wake_channel}}, queue) FROM j
)
SELECT EXISTS (SELECT 1 FROM j) AND (SELECT pg_catalog.count(*) FROM wake) >= 0
$$;

REVOKE EXECUTE ON FUNCTION
    {{schema}}.invalid(text, bigint, text, text),
    {{schema}}.valid_job(bigint, text, jsonb, text, timestamptz, interval, integer, integer, text, integer),
    {{schema}}.enqueue_jobs(text[], jsonb[], text[], timestamptz[], interval[], integer[], integer[], text[], integer),
    {{schema}}.enqueue(text, jsonb, text, timestamptz, interval, integer, integer, text),
    {{schema}}.json_text(jsonb, text, bigint),
    {{schema}}.json_int(jsonb, text, bigint),
    {{schema}}.json_time(jsonb, text, bigint),
    {{schema}}.json_interval(jsonb, text, bigint),
    {{schema}}.enqueue_many(jsonb),
    {{schema}}.cancel_jobs(bigint[]),
    {{schema}}.cancel(bigint),
    {{schema}}.retry(bigint)
FROM PUBLIC;
