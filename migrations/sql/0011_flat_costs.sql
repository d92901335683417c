-- Retention deletes one state at a time, each with its own cutoff: it reads
-- this index from the start of that state's range up to the state's cutoff,
-- so a batch touches the rows it deletes and not the finished rows that are
-- kept. The old index on finished_at alone made every batch step over all
-- kept rows of the other states (200,000 failed jobs kept 7 days: about
-- 100 ms per batch of succeeded jobs). Replaces jobs_finished_idx; still
-- not touched by enqueue (NULL finished_at). On a large table this build
-- blocks writes to jobs for its duration: run it in a quiet moment.
DROP INDEX {{schema}}.jobs_finished_idx;
CREATE INDEX jobs_finished_idx ON {{schema}}.jobs (state, finished_at)
    WHERE finished_at IS NOT NULL;
