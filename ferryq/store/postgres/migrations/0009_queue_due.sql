-- A claim promotes the due jobs of its own queues only, and a worker sleeps until the
-- next one of them is due (job_next_due): one index range per queue, within one
-- namespace (docs/design.md,
-- "One namespace per hot query"). The index replaces the one that counted a
-- queue's scheduled jobs, which its first two columns still do.
CREATE INDEX ferryq_jobs_queue_due ON ferryq_jobs (namespace, queue, run_at)
    WHERE state = 'scheduled';
DROP INDEX ferryq_jobs_queue_scheduled;
