-- The SQL API's input, checked as docs/sql.md says (found by an
-- adversarial review, 2026-12-03):
--
-- * metadata must be a JSON object of strings (NULL or JSON null: none).
--   enqueue and enqueue_many took any jsonb, and a Go handler then got
--   {"retries":3} as {"retries":""}. Now PW012 on the field metadata,
--   before anything is written. enqueue_one and enqueue_jobs, which the Go
--   client calls with metadata it checked itself, do not check it (the
--   readers hand a value that is not a string over as its JSON text).
-- * enqueue_many's "payload": null took JSON null as the payload where
--   enqueue, the CLI and every other key take null as the default ({}).
-- * a unique_period that does not parse raised PW005 (the schedule's code)
--   with the message "NULL is not an interval" for a number out of range;
--   now PW010, as docs/sql.md lists for unique_period, with the value given.
-- {{schema}} is the quoted schema name.

-- metadata_ok: true when m is none or a JSON object of strings. SQL and
-- inlinable; every name qualified.
CREATE FUNCTION {{schema}}.metadata_ok(m jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
SELECT m IS NULL OR pg_catalog.jsonb_typeof(m) OPERATOR(pg_catalog.=) 'null'
    OR (pg_catalog.jsonb_typeof(m) OPERATOR(pg_catalog.=) 'object'
        AND NOT pg_catalog.jsonb_path_exists(m, '$.* ? (@.type() != "string")'))
$$;

CREATE OR REPLACE FUNCTION {{schema}}.json_interval(job jsonb, key text, ord bigint) RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.jsonb_typeof(job -> key) = 'number' THEN
        RETURN (job ->> key)::float8 * interval '1 second';
    END IF;
    RETURN {{schema}}.json_text(job, key, ord)::interval;
EXCEPTION WHEN data_exception THEN
    PERFORM {{schema}}.invalid(CASE WHEN key = 'unique_period' THEN 'PW010' ELSE 'PW005' END, ord, key,
        pg_catalog.format('%s is not an interval (a string like ''10 minutes'' or a number of seconds)', job -> key));
END
$$;

-- enqueue_many: migration 0014's, with the metadata check and a JSON null
-- payload taken as the default.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad record;
    bad_ord bigint;
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
    SELECT e.ord INTO bad_ord
    FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord)
    WHERE NOT {{schema}}.metadata_ok(e.job -> 'metadata')
    ORDER BY e.ord LIMIT 1;
    IF FOUND THEN
        PERFORM {{schema}}.invalid('PW012', bad_ord, 'metadata', 'want a JSON object of strings');
    END IF;
    SELECT r.ids INTO result_ids
    FROM {{schema}}.enqueue_jobs(
        ARRAY(SELECT {{schema}}.json_text(e.job, 'kind', e.ord) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
        ARRAY(SELECT NULLIF(e.job -> 'payload', 'null'::jsonb) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord),
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
        ARRAY(SELECT NULLIF(e.job -> 'metadata', 'null'::jsonb) FROM pg_catalog.jsonb_array_elements(jobs) WITH ORDINALITY AS e(job, ord) ORDER BY e.ord)) r;
    RETURN result_ids;
END
$$;

-- enqueue: migration 0021's, with the metadata check first.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue(
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
    IF NOT {{schema}}.metadata_ok(metadata) THEN
        PERFORM {{schema}}.invalid('PW012', 1, 'metadata', 'want a JSON object of strings');
    END IF;
    metadata := NULLIF(metadata, 'null'::jsonb);
    -- plpgsql, not sql: its plans are cached for the session.
    IF coalesce(unique_key, '') = '' AND unique_scope IS NULL AND unique_hold IS NULL AND unique_period IS NULL THEN
        RETURN {{schema}}.enqueue_one(kind, payload, queue, run_after, delay, priority, max_attempts, metadata);
    END IF;
    RETURN ({{schema}}.enqueue_jobs(ARRAY[kind], ARRAY[payload], ARRAY[queue], ARRAY[run_after], ARRAY[delay],
        ARRAY[priority], ARRAY[max_attempts], ARRAY[unique_key], 1048576,
        ARRAY[unique_scope], ARRAY[unique_hold], ARRAY[unique_period], ARRAY[metadata])).ids[1];
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.metadata_ok(jsonb) FROM PUBLIC;
