-- Periodic tasks (@app.periodic), one row per task of a namespace, written by the
-- process leading its periodic tasks. checked_until is how far the schedule has been
-- handled: ticks after it are still to be enqueued, so a new leader or a restart
-- goes on from there. Each tick's job also carries a unique key, which makes an
-- enqueue repeated by a leader that crashed before moving checked_until a no-op.
CREATE TABLE ferryq_periodic (
    namespace     TEXT    NOT NULL,
    task          TEXT    NOT NULL,
    schedule      TEXT    NOT NULL,
    queue         TEXT    NOT NULL,
    catch_up      INTEGER NOT NULL,
    checked_until REAL    NOT NULL,
    last_tick     REAL,
    last_job      INTEGER,
    next_tick     REAL,
    updated_at    REAL    NOT NULL,
    PRIMARY KEY (namespace, task)
);
