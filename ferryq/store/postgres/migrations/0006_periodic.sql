-- Periodic tasks (@app.periodic), one row per task of a namespace, written by the
-- process leading its periodic tasks. checked_until is how far the schedule has been
-- handled: ticks after it are still to be enqueued, so a new leader or a restart
-- goes on from there. Each tick's job also carries a unique key, which makes an
-- enqueue repeated by a leader that crashed before moving checked_until a no-op.
CREATE TABLE ferryq_periodic (
    namespace     text             NOT NULL,
    task          text             NOT NULL,
    schedule      text             NOT NULL,
    queue         text             NOT NULL,
    catch_up      integer          NOT NULL,
    checked_until double precision NOT NULL,
    last_tick     double precision,
    last_job      bigint,
    next_tick     double precision,
    updated_at    double precision NOT NULL,
    PRIMARY KEY (namespace, task)
);
