-- Rates (app.set_lane_rate(pattern, n, per=seconds); docs/guarantees.md, "Rates per lane"): at most rate_n starts
-- of a lane in any rate_per seconds. Both null: the rule has no rate.
ALTER TABLE ferryq_lane_rules ADD COLUMN rate_n INTEGER;
ALTER TABLE ferryq_lane_rules ADD COLUMN rate_per REAL;

-- The window of each lane with a rate (see ferryq/lanes.py, gate): its last starts
-- (at most rate_n, as a JSON array, oldest first), the last due time a claim gave a
-- job it deferred for the rate, and until: after it the row says nothing any more
-- (maintenance deletes it with the history it prunes).
CREATE TABLE ferryq_lane_windows (
    namespace      TEXT NOT NULL,
    lane           TEXT NOT NULL,
    starts         TEXT NOT NULL DEFAULT '[]',
    deferred_until REAL,
    until          REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, lane)
);
