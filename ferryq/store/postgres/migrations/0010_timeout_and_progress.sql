-- Time limits and progress (docs/guarantees.md). timeout: the time limit of each attempt in seconds,
-- apart from the lease (null: none). progress: what the running attempt last reported
-- through ctx.progress, as JSON {"done", "total", "note", "at"}; a claim clears it.
ALTER TABLE ferryq_jobs ADD COLUMN timeout float8;
ALTER TABLE ferryq_jobs ADD COLUMN progress text;
ALTER TABLE ferryq_history ADD COLUMN timeout float8;
ALTER TABLE ferryq_history ADD COLUMN progress text;
