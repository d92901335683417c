-- watermill_publish (migration 0016) writes the jobs itself instead of
-- calling enqueue_jobs: same signature, same result, same rows, events and
-- wake-ups, the grants it had. A Watermill message job has no unique key,
-- priority, delay or metadata, so enqueue_jobs's general path (its column
-- checks, unique-key rounds, ON CONFLICT) is work every Publish paid for
-- nothing, as was the nested SECURITY DEFINER call (its settings set and
-- reset) and the statement that built its arrays. Each job is still checked
-- by valid_job, with the ordinal enqueue_jobs gave it (groups in name
-- order, messages in input order within a group), so errors are the same.
-- Cost measured in docs/watermill.md (Publish call p50).
CREATE OR REPLACE FUNCTION {{schema}}.watermill_publish(
    topic         text,
    kind          text,
    default_queue text,
    payloads      jsonb[],
    run_afters    timestamptz[],
    attempt_limit integer,
    payload_limit integer,
    OUT ids       bigint[],
    OUT queues    text[]
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    n    integer := coalesce(pg_catalog.cardinality(payloads), 0);
    woke bigint;
BEGIN
    SELECT pg_catalog.array_agg(s.queue ORDER BY s.consumer_group) INTO queues
    FROM {{schema}}.watermill_subscriptions s WHERE s.topic = watermill_publish.topic;
    IF queues IS NULL THEN
        queues := ARRAY[default_queue];
    END IF;
    IF n = 0 THEN
        ids := '{}';
        RETURN;
    END IF;
    IF run_afters IS NOT NULL AND pg_catalog.cardinality(run_afters) <> n THEN
        RAISE EXCEPTION USING ERRCODE = 'PW008',
            MESSAGE = 'pgwake: watermill_publish: run_afters must be NULL or as long as payloads';
    END IF;
    -- Ids come from the jobs' sequence in output order (the sequence is
    -- read after the sort), so the ids returned are in that order.
    WITH input AS MATERIALIZED (
        SELECT pg_catalog.nextval('{{schema}}.jobs_id_seq'::regclass) AS id, q.queue,
            coalesce(m.p, '{}'::jsonb) AS payload,
            coalesce(run_afters[m.o], pg_catalog.now()) AS run_after,
            {{schema}}.valid_job((q.o - 1) * n + m.o, kind, m.p, q.queue, run_afters[m.o], NULL, NULL,
                coalesce(attempt_limit, 5), NULL, payload_limit) AS valid
        FROM pg_catalog.unnest(queues) WITH ORDINALITY AS q(queue, o),
            pg_catalog.unnest(payloads) WITH ORDINALITY AS m(p, o)
        ORDER BY q.o, m.o
    ), ins AS (
        INSERT INTO {{schema}}.jobs AS j (id, queue, kind, payload, priority, run_after, max_attempts)
        SELECT i.id, i.queue, kind, i.payload, 0, i.run_after, coalesce(attempt_limit, 5)
        FROM input i WHERE i.valid ORDER BY i.id
        RETURNING j.id, j.queue, j.kind, j.run_after
    ), ev AS (
        INSERT INTO {{schema}}.events (job_id, type, queue, kind, attempt, data)
        SELECT x.id, 'enqueued', x.queue, x.kind, 0, pg_catalog.jsonb_build_object('run_after', x.run_after)
        FROM ins x ORDER BY x.id
    ), wake AS (
        -- As enqueue_jobs: one wake-up per queue a worker sleeps on.
        SELECT pg_catalog.pg_notify({{wake_channel}}, x.queue || CASE WHEN pg_catalog.min(x.run_after) > pg_catalog.clock_timestamp()
            THEN '|' || pg_catalog.ceil(EXTRACT(epoch FROM pg_catalog.min(x.run_after) - pg_catalog.clock_timestamp()) * 1000::numeric)::bigint::text
            ELSE '' END)
        FROM ins x GROUP BY x.queue HAVING {{schema}}.wake_needed(x.queue)
    )
    SELECT pg_catalog.array_agg(x.id ORDER BY x.id), (SELECT pg_catalog.count(*) FROM wake)
    INTO ids, woke FROM ins x;
END
$$;
