-- Watermill Pub/Sub publish in one round trip (events/pubsub Publisher):
-- the topic's consumer groups are read and the messages fanned out to their
-- queues in the statement that enqueues them. watermill_publish enqueues
-- every payload once per group registered on topic (groups in name order,
-- messages in input order within a group), or once on default_queue when
-- no group is registered, through enqueue_jobs (rows, 'enqueued' events,
-- wake-ups). run_afters may be NULL or hold NULLs (due now). It returns the
-- ids in that order and the queues, one per group.
CREATE FUNCTION {{schema}}.watermill_publish(
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
    n     integer := coalesce(pg_catalog.cardinality(payloads), 0);
    total integer;
    all_q text[];
    all_p jsonb[];
    all_r timestamptz[];
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
    total := n * pg_catalog.cardinality(queues);
    SELECT pg_catalog.array_agg(q.queue ORDER BY q.o, m.o),
        pg_catalog.array_agg(m.p ORDER BY q.o, m.o),
        pg_catalog.array_agg(run_afters[m.o] ORDER BY q.o, m.o)
    INTO all_q, all_p, all_r
    FROM pg_catalog.unnest(queues) WITH ORDINALITY AS q(queue, o),
        pg_catalog.unnest(payloads) WITH ORDINALITY AS m(p, o);
    SELECT e.ids INTO ids FROM {{schema}}.enqueue_jobs(
        pg_catalog.array_fill(kind, ARRAY[total]), all_p, all_q, all_r, NULL, NULL,
        pg_catalog.array_fill(attempt_limit, ARRAY[total]), NULL, payload_limit) e;
END
$$;

REVOKE EXECUTE ON FUNCTION
    {{schema}}.watermill_publish(text, text, text, jsonb[], timestamptz[], integer, integer)
FROM PUBLIC;
