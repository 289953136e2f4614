-- Lanes (see ferryq/lanes.py). Nothing is stored per lane: a lane's admitted jobs
-- (scheduled, ready, running) and its waiting jobs are found through these indexes,
-- each read at most a lane limit's worth of rows at a time.
CREATE INDEX ferryq_jobs_lane_waiting ON ferryq_jobs (namespace, lane, id)
    WHERE state = 'waiting';
CREATE INDEX ferryq_jobs_lane_held ON ferryq_jobs (namespace, lane, id)
    WHERE lane IS NOT NULL AND state <> 'waiting';

-- Limits and failure policies, for one lane ('post:42') or a prefix ('tenant:*').
CREATE TABLE ferryq_lane_rules (
    namespace  TEXT    NOT NULL,
    pattern    TEXT    NOT NULL,
    lane_limit INTEGER NOT NULL,
    on_dead    TEXT    NOT NULL,
    updated_at REAL    NOT NULL,
    PRIMARY KEY (namespace, pattern)
);

-- Lanes stopped behind a dead job (failure policy 'halt'), until it is respawned or
-- purged. A row exists only while a lane is halted.
CREATE TABLE ferryq_lane_halts (
    namespace TEXT    NOT NULL,
    lane      TEXT    NOT NULL,
    job_id    INTEGER NOT NULL,
    halted_at REAL    NOT NULL,
    PRIMARY KEY (namespace, lane)
);
CREATE INDEX ferryq_lane_halts_job ON ferryq_lane_halts (job_id);
