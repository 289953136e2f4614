-- Dependencies (task.options(after=[...]); docs/guarantees.md, "Dependencies"). A job may wait for others to end.
-- deps_left: how many of its dependencies have not ended yet. While it is above 0 the
-- job's run_at is ferryq.job.HELD, past any due time, so the job stays 'scheduled' (or
-- 'waiting' in its lane) and no promotion makes it ready; order_time keeps its place.
-- after_failed: 'run' runs the job even when a dependency did not succeed; null fails
-- it (the default). dep_failed: the first dependency that ended without success, as
-- JSON [id, state], when that fails the job: its worker ends it dead unrun.
ALTER TABLE ferryq_jobs ADD COLUMN deps_left integer NOT NULL DEFAULT 0;
ALTER TABLE ferryq_jobs ADD COLUMN after_failed text;
ALTER TABLE ferryq_jobs ADD COLUMN dep_failed text;

-- The graph: each row is "job_id waits for after_id", pos its place in the job's list
-- (a fan-in callback receives the results in that order). ended: the dependency's
-- terminal state once it has ended; rows stay after that, to show the graph.
CREATE TABLE ferryq_deps (
    job_id   bigint  NOT NULL,
    pos      integer NOT NULL,
    after_id bigint  NOT NULL,
    ended    text,
    PRIMARY KEY (job_id, pos)
);
CREATE INDEX ferryq_deps_after ON ferryq_deps (after_id);
CREATE INDEX ferryq_deps_open ON ferryq_deps (after_id) WHERE ended IS NULL;

-- Every job ends by its copy into history, whatever ends it (a finish, a cancel,
-- expiry, an operator): there its dependents learn of it, in the same transaction,
-- once per statement. A dependent whose last dependency ended, or whose failed
-- dependency fails it, gets its due time back: ready now if it is due and was
-- admitted ('scheduled'), else as any job due then. The work is O(dependents); with no
-- dependency open anywhere it is one probe of an empty index. The trigger that calls
-- this is created by the first enqueue with dependencies (dependency_trigger in
-- queries.sql), not here: its transition table costs every finish about 2 us a job,
-- which a database that never uses dependencies should not pay.
CREATE FUNCTION ferryq_dependencies_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    woken bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM ferryq_deps WHERE ended IS NULL) THEN
        RETURN NULL;
    END IF;
    WITH e AS (
        UPDATE ferryq_deps d SET ended = n.state FROM ended_jobs n
        WHERE d.after_id = n.id AND d.ended IS NULL
        RETURNING d.job_id, n.id, n.state, n.finished_at
    ), per_job AS (
        SELECT job_id, count(*) AS k, max(finished_at) AS at,
            (array_agg(jsonb_build_array(id, state) ORDER BY id)
                FILTER (WHERE state <> 'succeeded'))[1]::text AS failed
        FROM e GROUP BY job_id
    ), next AS (
        SELECT j.id, p.k, p.at,
            CASE WHEN j.after_failed IS NULL THEN coalesce(j.dep_failed, p.failed)
                 ELSE j.dep_failed END AS failed,
            j.run_at = 1e15 AND (j.deps_left = p.k OR (j.after_failed IS NULL
                AND coalesce(j.dep_failed, p.failed) IS NOT NULL)) AS release
        FROM ferryq_jobs j JOIN per_job p ON p.job_id = j.id
        ORDER BY j.id
        FOR UPDATE OF j
    ), moved AS (
        UPDATE ferryq_jobs j SET
            deps_left = j.deps_left - x.k,
            dep_failed = x.failed,
            run_at = CASE WHEN x.release THEN j.order_time + j.priority ELSE j.run_at END,
            state = CASE
                WHEN x.release AND j.state = 'scheduled' AND j.order_time + j.priority <= x.at
                THEN 'ready' ELSE j.state END
        FROM next x WHERE j.id = x.id
        RETURNING j.queue, j.state
    )
    SELECT count(pg_notify('ferryq_jobs', r.queue)) INTO woken
    FROM (SELECT DISTINCT queue FROM moved WHERE state = 'ready') r;
    RETURN NULL;
END
$$;
