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
