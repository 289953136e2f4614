-- Each worker's counters and histograms (a ferryq.metrics snapshot, JSON), renewed with
-- every heartbeat, for the server's /metrics.
ALTER TABLE ferryq_workers ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
