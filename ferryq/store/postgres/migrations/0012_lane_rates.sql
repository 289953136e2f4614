-- Rates (app.set_lane_rate(pattern, n, per=seconds); docs/guarantees.md, "Rates per lane"): at most rate_n starts
-- of a lane in any rate_per seconds. Both null: the rule has no rate.
ALTER TABLE ferryq_lane_rules ADD COLUMN rate_n integer;
ALTER TABLE ferryq_lane_rules ADD COLUMN rate_per double precision;

-- The window of each lane with a rate (see ferryq/lanes.py, gate): its last starts
-- (at most rate_n, as a JSON array, oldest first), the last due time a claim gave a
-- job it deferred for the rate, and until: after it the row says nothing any more
-- (maintenance deletes it with the history it prunes). A claim locks the row of each
-- lane whose jobs it picked, in key order, so claims of one lane decide one after
-- another, on every machine.
CREATE TABLE ferryq_lane_windows (
    namespace      text             NOT NULL,
    lane           text             NOT NULL,
    starts         text             NOT NULL DEFAULT '[]',
    deferred_until double precision,
    until          double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, lane)
);
