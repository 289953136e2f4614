-- Counts of finished jobs by namespace, queue and state, so that job_counts (the
-- dashboard, /metrics, `ferryq stats`) reads each history row once rather than at
-- every call. The rows up to `hid` of ferryq_history_folded are counted in
-- ferryq_history_counts; job_counts counts the rows after it as it reads them, and
-- maintenance folds them in (history_fold). Finishes only append, and pay nothing.
-- A counted row that is deleted (respawned, purged, pruned) is taken off by the
-- trigger; history rows are never updated.
CREATE TABLE ferryq_history_counts (
    namespace TEXT    NOT NULL,
    queue     TEXT    NOT NULL,
    state     TEXT    NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (namespace, queue, state)
) WITHOUT ROWID;

CREATE TABLE ferryq_history_folded (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    hid INTEGER NOT NULL
);
INSERT INTO ferryq_history_folded (one, hid) VALUES (1, 0);

-- Every delete: a counted row is taken off the counts; and as a new row takes the
-- largest hid plus one, hids at or below the mark would be given again once the
-- largest rows are gone (counted or not), so the mark follows the largest hid down.
CREATE TRIGGER ferryq_history_uncount AFTER DELETE ON ferryq_history
BEGIN
    UPDATE ferryq_history_counts SET n = n - 1
    WHERE old.hid <= (SELECT hid FROM ferryq_history_folded)
      AND namespace = old.namespace AND queue = old.queue AND state = old.state;
    UPDATE ferryq_history_folded SET hid = (SELECT coalesce(max(hid), 0) FROM ferryq_history)
    WHERE hid > (SELECT coalesce(max(hid), 0) FROM ferryq_history);
END;
