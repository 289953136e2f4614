-- ferryq_jobs is vacuumed once 1,000 of its rows are dead, whatever its size.
-- Every job leaves two dead rows here: its claim (an update, never HOT: it changes
-- state and lease_until, which the partial indexes read) and its finish (a delete).
-- PostgreSQL's default waits for 50 rows + 20% of the table: a queue holding a backlog
-- of a million delayed or waiting jobs would collect 200,000 dead rows before a vacuum.
-- Measured (python -m bench.soak --jobs 100000 --rate 500 --backlog 500000, durable
-- PostgreSQL 15, a transaction held open 60 s half-way; docs/operations.md, "Vacuum and
-- bloat"; medians of 3 rounds): with the default no autovacuum ran in 200 s, dead rows
-- reached 199,000 and the heap grew by 21 MB from the transaction's start; with these
-- options the table was vacuumed at every visit of the autovacuum launcher (once a
-- minute), dead rows peaked at 118,000 and the heap grew by 12 MB. With a small
-- backlog both vacuum at every visit: the options change nothing there.
-- Not set, for want of a measured gain: a cost delay of 0 (the same sizes and vacuums
-- at 2,500 jobs/s) and a fillfactor (no claim or finish is a HOT update).
-- The lock this takes (SHARE UPDATE EXCLUSIVE) lets claims and finishes go on.
ALTER TABLE ferryq_jobs
    SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
