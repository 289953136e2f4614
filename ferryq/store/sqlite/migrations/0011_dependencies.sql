-- Dependencies (task.options(after=[...]); docs/guarantees.md, "Dependencies"). A job may wait for others to end.
-- deps_left: how many of its dependencies have not ended yet. While it is above 0 the
-- job's run_at is ferryq.job.HELD, past any due time, so the job stays 'scheduled' (or
-- 'waiting' in its lane) and no promotion makes it ready; order_time keeps its place.
-- after_failed: 'run' runs the job even when a dependency did not succeed; null fails
-- it (the default). dep_failed: the first dependency that ended without success, as
-- JSON [id, state], when that fails the job: its worker ends it dead unrun.
ALTER TABLE ferryq_jobs ADD COLUMN deps_left INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ferryq_jobs ADD COLUMN after_failed TEXT;
ALTER TABLE ferryq_jobs ADD COLUMN dep_failed TEXT;

-- The graph: each row is "job_id waits for after_id", pos its place in the job's list
-- (a fan-in callback receives the results in that order). ended: the dependency's
-- terminal state once it has ended; rows stay after that, to show the graph.
CREATE TABLE ferryq_deps (
    job_id   INTEGER NOT NULL,
    pos      INTEGER NOT NULL,
    after_id INTEGER NOT NULL,
    ended    TEXT,
    PRIMARY KEY (job_id, pos)
);
CREATE INDEX ferryq_deps_after ON ferryq_deps (after_id);

-- Every job ends by its copy into history, whatever ends it (a finish, a cancel,
-- expiry, an operator): there its dependents learn of it, in the same transaction.
-- A dependent whose last dependency ended, or whose failed dependency fails it, gets
-- its due time back: ready now if it is due and was admitted ('scheduled'), else as
-- any job due then. The work is O(dependents), and nothing when there are none.
CREATE TRIGGER ferryq_dependency_ends AFTER INSERT ON ferryq_history
WHEN EXISTS (SELECT 1 FROM ferryq_deps WHERE after_id = NEW.id AND ended IS NULL)
BEGIN
    UPDATE ferryq_jobs SET
        deps_left = deps_left - 1,
        dep_failed = CASE
            WHEN NEW.state <> 'succeeded' AND after_failed IS NULL AND dep_failed IS NULL
            THEN json_array(NEW.id, NEW.state) ELSE dep_failed END
    WHERE id IN (SELECT job_id FROM ferryq_deps WHERE after_id = NEW.id AND ended IS NULL);
    UPDATE ferryq_deps SET ended = NEW.state WHERE after_id = NEW.id AND ended IS NULL;
    UPDATE ferryq_jobs SET
        run_at = order_time + priority,
        state = CASE
            WHEN state = 'scheduled' AND order_time + priority <= NEW.finished_at
            THEN 'ready' ELSE state END
    WHERE id IN (SELECT job_id FROM ferryq_deps WHERE after_id = NEW.id)
      AND run_at = 1e15 AND (deps_left = 0 OR dep_failed IS NOT NULL);
END;
