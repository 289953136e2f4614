-- A lane's finished jobs, newest first (the dashboard's jobs list filtered by lane):
-- without it, a lane with few jobs means reading the history back to its first job.
-- Only jobs in a lane are indexed, so finishing any other job costs nothing more.
CREATE INDEX ferryq_history_lane ON ferryq_history (lane, id) WHERE lane IS NOT NULL;
