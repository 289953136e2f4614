-- Counts of finished jobs by day, namespace, queue and state, so that job_counts (the
-- dashboard, /metrics, `ferryq stats`) reads a day's partition of the history once,
-- not at every call. Maintenance folds a partition an hour after its day ends
-- (history_fold): it counts the partition into this table and gives it the trigger
-- below, in one transaction, so that a row added to or removed from it later (a
-- late finish, a respawn, a purge) is counted too. Partitions not folded yet, and
-- the default partition, are counted as job_counts reads them. Dropping a partition
-- drops its day here. Finishes into the partitions still being written pay nothing.
CREATE TABLE ferryq_history_counts (
    day       integer NOT NULL,  -- days since the epoch (UTC), as the partition's name
    namespace text    NOT NULL,
    queue     text    NOT NULL,
    state     text    NOT NULL,
    n         bigint  NOT NULL,
    PRIMARY KEY (day, namespace, queue, state)
);

CREATE FUNCTION ferryq_history_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO ferryq_history_counts (day, namespace, queue, state, n)
        VALUES (TG_ARGV[0]::integer, NEW.namespace, NEW.queue, NEW.state, 1)
        ON CONFLICT (day, namespace, queue, state)
        DO UPDATE SET n = ferryq_history_counts.n + 1;
    ELSE
        UPDATE ferryq_history_counts SET n = n - 1
        WHERE day = TG_ARGV[0]::integer AND namespace = OLD.namespace
          AND queue = OLD.queue AND state = OLD.state;
    END IF;
    RETURN NULL;
END
$$;
