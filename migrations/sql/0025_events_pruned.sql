-- How far `pgwake events prune` (events.DeleteBefore) has deleted: the
-- highest event id it deleted. A reader that resumes the event log after an
-- id below it may have missed events that were pruned; the dashboard's
-- stream tells such a page to reload instead of skipping them silently
-- (queue.Client.EventsPrunedThrough, ui's TestResumeAcrossPrunedEventsReloads).
-- One row at most; none until the first prune that deletes something.
CREATE TABLE {{schema}}.events_pruned (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    through bigint  NOT NULL
);

-- Grants made before this migration keep working (docs/grants.sql): a role
-- that may delete events (`pgwake events prune`) may record how far it
-- did; a role that may read them (the dashboard, the event stream) may read
-- that too, also when granted SELECT on columns of events only. A grant to
-- PUBLIC (grantee 0) carries over to PUBLIC
-- (TestEventsPrunedKeepsPublicEventGrants); the owner of events, when
-- another role runs this, is a role that may delete them
-- (TestEventsPrunedKeepsTheEventsOwner).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
            pg_catalog.bool_or(a.privilege_type = 'DELETE') AS prunes
        FROM pg_catalog.pg_class c, LATERAL (
            SELECT * FROM pg_catalog.aclexplode(c.relacl)
            UNION ALL -- SELECT granted on columns only
            SELECT x.* FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) x
            WHERE t.attrelid = c.oid AND t.attnum > 0 AND NOT t.attisdropped
            UNION ALL -- its owner, when not the role running this
            SELECT c.relowner, c.relowner, 'DELETE', false
        ) a
        WHERE c.oid = '{{schema}}.events'::regclass
          AND a.privilege_type IN ('SELECT', 'DELETE')
          AND a.grantee <> (SELECT p.relowner FROM pg_catalog.pg_class p WHERE p.oid = '{{schema}}.events_pruned'::regclass)
        GROUP BY a.grantee
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON {{schema}}.events_pruned TO %s',
            CASE WHEN g.prunes THEN 'SELECT, INSERT, UPDATE' ELSE 'SELECT' END, g.grantee);
    END LOOP;
END
$$;
