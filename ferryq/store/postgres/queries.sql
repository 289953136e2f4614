-- Named statements of the PostgreSQL backend. A name that SQLite's queries.sql has too
-- means the same there; the flows written once for both backends (ferryq/store/flows.py,
-- STATEMENTS) run only such names, with the same parameters on both (SQLite leaves out
-- the locks: its write transaction holds the database's write lock). The other names
-- are this backend's own: the hot paths, the lane steps, the partitions and
-- leadership are written for each database apart.
-- A statement that reads the same on both backends is in ferryq/store/queries.sql, not
-- here. tests/unit/test_store_queries.py checks what this header says.
-- Parameters are named (:now) and become $n for asyncpg, %(now)s for psycopg, when
-- loaded (queries.py); column lists and the rule of a claim ({claim_set}) are filled in
-- from ferryq/store/sql.py.

-- name: job_insert_batch
-- One statement for a batch of jobs alike but for their args, and its one wake-up
-- NOTIFY (delivered at commit) when :notify (see ferryq.store.postgres.notices): a
-- single round trip, atomic without BEGIN. unnest
-- keeps the input order, so the identity values rise in that order; they come back
-- as one array. The notifying CTE is volatile, hence evaluated once, by the EXISTS.
-- Jobs of a lane take the lane's lock (as lane_lock does) before the first row goes
-- in, by the insert's one-time filter: a round trip fewer per enqueue into a lane.
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended(:namespace || '/' || :lane, 11))
    WHERE :lane::text IS NOT NULL
), inserted AS (
    INSERT INTO ferryq_jobs (namespace, queue, task, args, state, lane, priority, run_at,
        order_time, expires_at, ttr, max_tries, retry, unique_key, stage, context, meta,
        created_at, timeout)
    SELECT :namespace, :queue, :task, a.args, :state, :lane, :priority::float8,
        :run_at::float8, :order_time::float8, :expires_at::float8, :ttr::float8,
        :max_tries, :retry, :unique_key, :stage, :context, :meta::jsonb,
        :created_at::float8, :timeout::float8
    FROM unnest(:args::text[]) WITH ORDINALITY AS a(args, n)
    WHERE :lane::text IS NULL OR EXISTS (SELECT FROM locked)
    ORDER BY a.n
    RETURNING id
), woken AS (
    SELECT pg_notify('ferryq_jobs', :queue) WHERE :notify::boolean
)
SELECT array_agg(id ORDER BY id) FROM inserted
WHERE NOT :notify::boolean OR EXISTS (SELECT FROM woken);

-- name: job_insert_rows
-- The jobs of enqueue calls made at the same time (see ferryq.store.coalesce), none in
-- a lane or with a unique key: one statement, atomic without BEGIN, each column an
-- array of one element per job. The ids rise in input order, as in job_insert_batch.
-- One NOTIFY per queue when :notify: count(*) reads every row of the volatile CTE
-- (EXISTS would stop at the first).
WITH inserted AS (
    INSERT INTO ferryq_jobs (namespace, queue, task, args, state, priority, run_at,
        order_time, expires_at, ttr, max_tries, retry, stage, context, meta, created_at,
        timeout)
    SELECT r.namespace, r.queue, r.task, r.args, r.state, r.priority, r.run_at,
        r.order_time, r.expires_at, r.ttr, r.max_tries, r.retry, r.stage, r.context,
        r.meta::jsonb, r.created_at, r.timeout
    FROM unnest(:namespaces::text[], :queues::text[], :tasks::text[], :args::text[],
        :states::text[], :priorities::float8[], :run_ats::float8[],
        :order_times::float8[], :expires_ats::float8[], :ttrs::float8[],
        :max_tries::int[], :retries::text[], :stages::text[], :contexts::text[],
        :metas::text[], :created_ats::float8[], :timeouts::float8[])
        WITH ORDINALITY AS r(namespace, queue, task, args, state, priority, run_at,
            order_time, expires_at, ttr, max_tries, retry, stage, context, meta,
            created_at, timeout, n)
    ORDER BY r.n
    RETURNING id
), woken AS (
    SELECT pg_notify('ferryq_jobs', q.queue) FROM (SELECT DISTINCT unnest(:queues::text[]) AS queue) q
    WHERE :notify::boolean
)
SELECT array_agg(id ORDER BY id) FROM inserted
WHERE NOT :notify::boolean OR (SELECT count(*) FROM woken) > 0;

-- name: job_lock_unique
-- Serialises enqueues of one key (released at commit), so dedup is atomic.
SELECT pg_advisory_xact_lock(hashtextextended(:namespace || '/' || :unique_key, 7));

-- name: job_promote_due
-- Maintenance's promotion, of every queue.
UPDATE ferryq_jobs SET state = 'ready'
WHERE id = ANY(ARRAY(SELECT id FROM ferryq_jobs WHERE state = 'scheduled' AND run_at <= :now
                     ORDER BY run_at LIMIT :limit FOR UPDATE SKIP LOCKED));

-- name: job_promote_due_queues
-- A claim's promotion: the due jobs of its own queues, a range of
-- ferryq_jobs_queue_due each, up to :limit per queue.
UPDATE ferryq_jobs SET state = 'ready'
WHERE id = ANY(ARRAY(
    SELECT d.id FROM unnest(:queues::text[]) AS q(queue), LATERAL (
        SELECT id FROM ferryq_jobs
        WHERE state = 'scheduled' AND namespace = :namespace AND queue = q.queue
          AND run_at <= :now
        ORDER BY run_at LIMIT :limit FOR UPDATE SKIP LOCKED) d));

-- name: job_claim_queue
-- SKIP LOCKED: concurrent workers take disjoint rows without waiting on each other.
-- = ANY(ARRAY(...)) makes the update a primary-key lookup per picked row; a join
-- with the picked rows could plan as a scan of the whole table.
UPDATE ferryq_jobs j
SET {claim_set}
WHERE j.id = ANY(ARRAY(
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
      AND NOT EXISTS (SELECT FROM ferryq_lane_rules  -- a rate: see job_pick
                      WHERE namespace = :namespace AND rate_n IS NOT NULL)
    ORDER BY order_time, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED))
RETURNING {claim_columns};

-- name: job_claim_queues
UPDATE ferryq_jobs j
SET {claim_set}
WHERE j.id = ANY(ARRAY(
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = ANY(:queues::text[])
      AND (expires_at IS NULL OR expires_at > :now)
      AND NOT EXISTS (SELECT FROM ferryq_lane_rules  -- a rate: see job_pick
                      WHERE namespace = :namespace AND rate_n IS NOT NULL)
    ORDER BY order_time, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED))
RETURNING {claim_columns};

-- name: job_next_due
-- The first due time in these queues: one index range of ferryq_jobs_queue_due each.
SELECT min(d.run_at) FROM unnest(:queues::text[]) AS q(queue), LATERAL (
    SELECT run_at FROM ferryq_jobs
    WHERE state = 'scheduled' AND namespace = :namespace AND queue = q.queue
    ORDER BY run_at LIMIT 1) d;

-- name: job_finish_batch_to_history
-- Many finishes in one statement. A stale token joins no row, so it moves nothing.
-- First, by the delete's one-time filter, it takes the locks of the lanes of every
-- job of the batch (:lock_ids, whatever each finish does), as lane_lock_jobs does,
-- before it touches a row: the lanes are read from the rows, not taken from the
-- caller, and the lock costs no round trip of its own.
WITH locked AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(s.k)) FROM (
        SELECT DISTINCT hashtextextended(x.namespace || '/' || x.lane, 11) AS k
        FROM ferryq_jobs x WHERE x.id = ANY(:lock_ids::bigint[]) AND x.lane IS NOT NULL
        ORDER BY k) s
), f AS (
    SELECT * FROM unnest(:ids::bigint[], :fences::bigint[], :states::text[],
        :results::text[], :errors::jsonb[], :started::float8[], :finished::float8[])
        AS f(id, fence, state, result, error, started_at, finished_at)
), moved AS (
    DELETE FROM ferryq_jobs j USING f
    WHERE j.id = f.id AND j.fence = f.fence AND j.state = 'running'
      AND EXISTS (SELECT FROM locked)
    RETURNING j.*, f.state AS f_state, f.result AS f_result, f.error AS f_error,
        f.started_at AS f_started_at, f.finished_at AS f_finished_at
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_finish_columns} FROM moved j
RETURNING id, namespace, lane, state;

-- name: dependency_trigger
-- The history's trigger that resolves dependencies (migration 0011), made once, by the
-- first enqueue with dependencies, in a transaction of its own: it takes a lock on the
-- history that waits for the finishes under way.
DO $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('ferryq_dependency_ends'));
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'ferryq_dependency_ends'
                   AND tgrelid = 'ferryq_history'::regclass) THEN
        CREATE TRIGGER ferryq_dependency_ends AFTER INSERT ON ferryq_history
        REFERENCING NEW TABLE AS ended_jobs
        FOR EACH STATEMENT EXECUTE FUNCTION ferryq_dependencies_end();
    END IF;
END
$$;

-- name: dependency_trigger_exists
SELECT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'ferryq_dependency_ends'
               AND tgrelid = 'ferryq_history'::regclass);

-- name: job_dependencies_hot
-- The dependencies named by an enqueue that have not ended, locked: none ends unseen
-- before the enqueue commits (one that ends meanwhile is found by the next statement).
SELECT id, namespace, state FROM ferryq_jobs
WHERE id IN (SELECT jsonb_array_elements_text(:ids::text::jsonb)::bigint)
ORDER BY id FOR SHARE;

-- name: job_dependencies_ended
SELECT id, namespace, state FROM ferryq_history
WHERE id IN (SELECT jsonb_array_elements_text(:ids::text::jsonb)::bigint);

-- name: job_hold
UPDATE ferryq_jobs
SET deps_left = :deps_left::integer, after_failed = :after_failed::text,
    dep_failed = :dep_failed::text
WHERE id IN (SELECT jsonb_array_elements_text(:ids::text::jsonb)::bigint);

-- name: job_dependencies_add
-- :after lists the dependencies' ids in the order given; one that has ended is in
-- history, with its state (none ends meanwhile: job_dependencies_hot locked the rest).
-- A join, not a subquery per edge: the planner guesses 100 rows for each array, and
-- a subquery over every partition then costs enough to be compiled (JIT, 15 ms).
INSERT INTO ferryq_deps (job_id, pos, after_id, ended)
SELECT j::bigint, d.pos - 1, d.v::bigint, h.state
FROM jsonb_array_elements_text(:ids::text::jsonb) AS j
CROSS JOIN jsonb_array_elements_text(:after::text::jsonb) WITH ORDINALITY AS d(v, pos)
LEFT JOIN ferryq_history h ON h.id = d.v::bigint;

-- name: job_cancel_if_requested
-- An attempt that ends without success on a job whose cancellation was requested
-- ends the job: it is not retried, queued for its next stage, or handed back.
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = :id AND j.fence = :fence AND j.state = 'running' AND j.cancel_requested
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM moved j
RETURNING id, namespace, lane;

-- name: job_requeue
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    started_at = :started_at, finished_at = :finished_at, error = :error::jsonb,
    errors = CASE WHEN :error::jsonb IS NULL THEN errors
                  ELSE errors || jsonb_build_array(:error::jsonb) END
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_next_stage
-- The stage that ran is recorded with its tries; the next one starts with none.
-- Every SET expression reads the row as it was before the update.
UPDATE ferryq_jobs
SET state = :state, run_at = :run_at, order_time = :order_time, lease_until = NULL,
    stages = stages || jsonb_build_array(jsonb_build_object(
        'stage', stage, 'outcome', 'next', 'attempts', attempts,
        'started_at', :started_at::float8, 'finished_at', :finished_at::float8)),
    stage = :stage, context = :context, attempts = 0, error = NULL,
    started_at = :started_at, finished_at = :finished_at
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_return
UPDATE ferryq_jobs
SET state = 'ready', attempts = greatest(attempts - 1, 0), started_at = NULL,
    lease_until = NULL, worker = NULL
WHERE id = :id AND fence = :fence AND state = 'running'
RETURNING id;

-- name: job_lease_extend
-- A started time (else null) is when the attempt's handler really began, after the claim;
-- a progress (else null) is what the attempt last reported, as JSON text.
-- SKIP LOCKED: a renewal never waits for a row another transaction holds (the finish
-- of that very attempt, most likely), so it is never one side of a deadlock, which its
-- rows, locked in no set order, could otherwise make with a batch of finishes. A row
-- skipped is not renewed this time; the next renewal comes within a third of its ttr.
UPDATE ferryq_jobs j SET lease_until = :now + j.ttr, started_at = coalesce(f.started, j.started_at),
    progress = coalesce(f.progress, j.progress)
FROM unnest(:ids::bigint[], :fences::bigint[], :started::float8[], :progress::text[])
    AS f(id, fence, started, progress)
WHERE j.id = f.id AND j.fence = f.fence AND j.state = 'running'
  AND j.id = ANY(ARRAY(SELECT id FROM ferryq_jobs WHERE id = ANY(:ids::bigint[])
                       FOR UPDATE SKIP LOCKED))
RETURNING j.id;

-- name: job_held
SELECT id, fence, cancel_requested FROM ferryq_jobs
WHERE id = ANY(:ids::bigint[]) AND state = 'running';

-- name: job_expired_leases
SELECT {claim_columns} FROM ferryq_jobs j
WHERE state = 'running' AND lease_until < :now
ORDER BY lease_until LIMIT :limit;

-- name: job_expire_candidates
SELECT id, namespace, lane FROM ferryq_jobs
WHERE expires_at <= :now AND state IN ('scheduled', 'waiting', 'ready')
ORDER BY expires_at LIMIT :limit;

-- name: job_expire
-- The candidates' lanes are locked by now; a row another transaction holds is left
-- for the next round.
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = ANY(ARRAY(SELECT id FROM ferryq_jobs
                   WHERE id = ANY(:ids::bigint[]) AND expires_at <= :now
                     AND state IN ('scheduled', 'waiting', 'ready')
                   FOR UPDATE SKIP LOCKED))
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_expired_columns} FROM moved j
RETURNING id, namespace, lane;

-- name: job_move_terminal
-- An operator ends a job that is not running (cancel; its row locked by job_lock): its
-- copy in history; job_delete then takes it out of the hot table.
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM ferryq_jobs j
WHERE j.id = :id AND j.state IN ('scheduled', 'waiting', 'ready');

-- name: job_request_cancel
UPDATE ferryq_jobs SET cancel_requested = true WHERE id = :id AND state = 'running';

-- name: job_lock
-- An operator's change to one job: its lane's lock first (lane_lock), then its row.
SELECT state FROM ferryq_jobs WHERE id = :id FOR UPDATE;

-- name: job_respawn
WITH moved AS (
    DELETE FROM ferryq_history j
    WHERE j.id = ANY(:ids::bigint[]) AND j.state IN ('dead', 'cancelled', 'expired')
    RETURNING j.*
)
INSERT INTO ferryq_jobs ({job_columns}) OVERRIDING SYSTEM VALUE
SELECT {respawn_columns} FROM moved j
RETURNING id;

-- name: job_purge
DELETE FROM ferryq_history WHERE id = ANY(:ids::bigint[]) AND state = 'dead' RETURNING id;

-- name: job_counts
-- The hot jobs and the history's folded days (see migration 0008); the partitions
-- not folded yet are read whole beside it (partitions.counts), in the same snapshot.
-- A group may come in several rows: ferryq.store.flows.job_counts adds them up.
SELECT namespace, queue, state, count(*) AS n FROM ferryq_jobs
WHERE :namespace::text IS NULL OR namespace = :namespace
GROUP BY namespace, queue, state
UNION ALL
SELECT namespace, queue, state, sum(n)::bigint FROM ferryq_history_counts
WHERE :namespace::text IS NULL OR namespace = :namespace
GROUP BY namespace, queue, state HAVING sum(n) > 0;

-- name: history_partitions
-- Daily partitions are named ferryq_history_pYYYYMMDD; a folded one has the trigger
-- that keeps its counts.
SELECT c.relname, EXISTS (SELECT FROM pg_trigger t
                          WHERE t.tgrelid = c.oid AND t.tgname = 'ferryq_history_counted')
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = 'ferryq_history' AND c.relname LIKE 'ferryq\_history\_p%'
ORDER BY c.relname;

-- name: history_counts_drop
DELETE FROM ferryq_history_counts WHERE day = :day;

-- name: history_prune_default
DELETE FROM ferryq_history_default
WHERE ctid IN (SELECT ctid FROM ferryq_history_default WHERE finished_at < :before
               LIMIT :limit);

-- name: server_time
-- The server's clock (ferryq/clock.py), which every App on PostgreSQL keeps.
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: leader_try
SELECT pg_try_advisory_lock(hashtextextended('ferryq:leader:' || :name, 7));

-- name: leader_unlock
SELECT pg_advisory_unlock(hashtextextended('ferryq:leader:' || :name, 7));

-- name: leader_acquire
-- Behind a transaction pooler: the lease row, taken when free or run out, renewed by
-- its holder (a row back: held).
INSERT INTO ferryq_leaders (name, holder, expires_at) VALUES (:name, :holder, :expires_at)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE ferryq_leaders.holder = excluded.holder OR ferryq_leaders.expires_at < :now
RETURNING 1;

-- name: leader_release
DELETE FROM ferryq_leaders WHERE name = :name AND holder = :holder RETURNING 1;

-- name: leader_lease
SELECT holder, expires_at FROM ferryq_leaders WHERE name = :name;

-- name: lane_lock
-- Serialises the decisions about a lane (released at commit). Taken in key order, and
-- before any job row, so two transactions never wait on each other in a circle. The
-- count runs over the ordered keys and comes back as one row, not one per lock.
SELECT count(pg_advisory_xact_lock(s.k)) FROM (
    SELECT DISTINCT hashtextextended(t.n || '/' || t.l, 11) AS k
    FROM unnest(:namespaces::text[], :lanes::text[]) AS t(n, l)
    ORDER BY k) s;

-- name: lane_lock_jobs
-- The same, for the lanes of jobs about to finish, read from their rows (a job's lane
-- never changes), whatever lane the caller thinks they are in.
SELECT count(pg_advisory_xact_lock(s.k)) FROM (
    SELECT DISTINCT hashtextextended(namespace || '/' || lane, 11) AS k
    FROM ferryq_jobs WHERE id = ANY(:ids::bigint[]) AND lane IS NOT NULL
    ORDER BY k) s;

-- name: lane_of_history
SELECT DISTINCT namespace, lane FROM ferryq_history
WHERE id = ANY(:ids::bigint[]) AND lane IS NOT NULL;

-- name: lane_rules
SELECT namespace, pattern, lane_limit, on_dead, rate_n, rate_per FROM ferryq_lane_rules
WHERE namespace = ANY(:namespaces::text[])
ORDER BY namespace, pattern COLLATE "C";

-- name: lane_rule_set
INSERT INTO ferryq_lane_rules (namespace, pattern, lane_limit, on_dead, rate_n, rate_per,
                               updated_at)
VALUES (:namespace, :pattern, :lane_limit, :on_dead, :rate_n::integer, :rate_per::float8, :now)
ON CONFLICT (namespace, pattern) DO UPDATE SET lane_limit = excluded.lane_limit,
    on_dead = excluded.on_dead, rate_n = excluded.rate_n, rate_per = excluded.rate_per,
    updated_at = excluded.updated_at;

-- name: lane_rated
-- Whether any rule of the namespace has a rate: its claims then go through the gate.
SELECT EXISTS (SELECT FROM ferryq_lane_rules
               WHERE namespace = :namespace AND rate_n IS NOT NULL);

-- name: job_pick
-- A claim's pick in a namespace with a rate: the ready jobs it would take, locked
-- (SKIP LOCKED, as job_claim_queues), for the rate gate to decide on.
SELECT id, lane, claimed_at IS NOT NULL AS started FROM ferryq_jobs
WHERE state = 'ready' AND namespace = :namespace AND queue = ANY(:queues::text[])
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY order_time, id
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: lane_windows_lock
-- The windows of these lanes, made if new, each row locked in key order: claims of one
-- lane, from any machine, pass the gate one after another. Once it has the lock, the
-- update reads the row as the claim before committed it.
INSERT INTO ferryq_lane_windows (namespace, lane)
SELECT :namespace, l FROM jsonb_array_elements_text(:lanes::text::jsonb) AS l ORDER BY l
ON CONFLICT (namespace, lane) DO UPDATE SET namespace = excluded.namespace
RETURNING lane, starts, deferred_until;

-- name: lane_unstarted
-- The admitted jobs of these lanes that have not started: at most a limit's worth each.
-- Read after lane_windows_lock, in a snapshot of its own: what the claims before
-- committed is seen.
SELECT j.lane, j.id, j.state, j.run_at
FROM jsonb_array_elements_text(:lanes::text::jsonb) AS l(lane)
JOIN ferryq_jobs j ON j.namespace = :namespace AND j.lane = l.lane AND j.state <> 'waiting'
WHERE j.state IN ('ready', 'scheduled') AND j.claimed_at IS NULL
ORDER BY j.lane, j.id;

-- name: lane_windows_put
-- The windows after a claim: :windows lists [lane, starts, deferred_until, until].
UPDATE ferryq_lane_windows AS x SET starts = w.v ->> 1,
    deferred_until = (w.v ->> 2)::float8, until = (w.v ->> 3)::float8
FROM jsonb_array_elements(:windows::text::jsonb) AS w(v)
WHERE x.namespace = :namespace AND x.lane = w.v ->> 0;

-- name: job_defer
-- Ready jobs a claim picked that its lane's rate does not let start yet: scheduled
-- again, due when the window has room (:defer lists [id, due] pairs).
UPDATE ferryq_jobs j SET state = 'scheduled', run_at = (d.v ->> 1)::float8
FROM jsonb_array_elements(:defer::text::jsonb) AS d(v)
WHERE j.id = (d.v ->> 0)::bigint AND j.state = 'ready';

-- name: job_claim
-- The jobs a claim picked (job_pick) that the rate gate let start.
UPDATE ferryq_jobs j
SET {claim_set}
WHERE j.id IN (SELECT jsonb_array_elements_text(:ids::text::jsonb)::bigint)
  AND j.state = 'ready'
RETURNING {claim_columns};

-- name: job_take_ids
-- job_take of the jobs a pick locked and the rate gate let start (see job_claim).
UPDATE ferryq_jobs j
SET {take_set}
WHERE j.id IN (SELECT jsonb_array_elements_text(:ids::text::jsonb)::bigint)
  AND j.state = 'ready'
RETURNING {job_columns};

-- name: lane_halt
INSERT INTO ferryq_lane_halts (namespace, lane, job_id, halted_at)
SELECT t.n, t.l, t.j, :now::float8
FROM unnest(:namespaces::text[], :lanes::text[], :job_ids::bigint[]) AS t(n, l, j)
ON CONFLICT (namespace, lane) DO NOTHING;

-- name: lane_release
-- Respawning or purging the dead job that halted a lane releases it.
DELETE FROM ferryq_lane_halts WHERE job_id = ANY(:ids::bigint[])
RETURNING namespace, lane, job_id;

-- name: lane_resume
-- The dead job that halted its lane, respawned: it goes first and keeps its place, as
-- a retry does, so it is admitted at once, even where jobs started before it died
-- fill a limit lowered since.
WITH resumed AS (
    UPDATE ferryq_jobs SET state = CASE WHEN run_at > :now THEN 'scheduled' ELSE 'ready' END
    WHERE id = ANY(:ids::bigint[]) AND state = 'waiting'
    RETURNING queue, state
)
SELECT pg_notify('ferryq_jobs', q.queue)
FROM (SELECT DISTINCT queue FROM resumed WHERE state = 'ready') q;

-- name: lane_snapshot
-- Per lane: the dead job halting it, its admitted jobs, its first :limits waiting jobs.
-- Each is an index range of at most a limit's worth of rows, however long the lane.
SELECT t.n, t.l,
    (SELECT h.job_id FROM ferryq_lane_halts h WHERE h.namespace = t.n AND h.lane = t.l),
    (SELECT coalesce(json_agg(json_build_array(j.id, j.state, j.claimed_at IS NOT NULL,
                                               j.run_at, j.order_time, j.queue)
                              ORDER BY j.id), '[]')
     FROM ferryq_jobs j
     WHERE j.namespace = t.n AND j.lane = t.l AND j.state <> 'waiting')::text,
    (SELECT coalesce(json_agg(json_build_array(w.id, w.run_at, w.order_time, w.queue)
                              ORDER BY w.id), '[]')
     FROM ferryq_jobs w
     WHERE w.id = ANY(ARRAY(
         -- The first waiting jobs up to the limit, one index step at a time, in the
         -- lane index's own order (see lane_settle for why), while still in the lane.
         WITH RECURSIVE steps(id, room) AS (
             SELECT (SELECT x.id FROM ferryq_jobs x
                     WHERE x.namespace = t.n AND x.lane = t.l
                       AND x.id = (SELECT j.id FROM ferryq_jobs j
                                   WHERE j.state = 'waiting' AND (j.namespace, j.lane) >= (t.n, t.l)
                                   ORDER BY j.namespace, j.lane, j.id LIMIT 1)), t.k
             UNION ALL
             SELECT (SELECT x.id FROM ferryq_jobs x
                     WHERE x.namespace = t.n AND x.lane = t.l
                       AND x.id = (SELECT j.id FROM ferryq_jobs j
                                   WHERE j.state = 'waiting'
                                     AND (j.namespace, j.lane, j.id) > (t.n, t.l, s.id)
                                   ORDER BY j.namespace, j.lane, j.id LIMIT 1)), s.room - 1
             FROM steps s WHERE s.room > 1 AND s.id IS NOT NULL)
         SELECT id FROM steps WHERE id IS NOT NULL)))::text
FROM unnest(:namespaces::text[], :lanes::text[], :limits::int[]) AS t(n, l, k);

-- name: lane_settle
-- The rule of ferryq/lanes.py in one statement, for every lane that needs no step
-- back (not halted, not over its limit): those few are returned ('rest'), for the
-- general path. Per lane it reads its rule, its admitted jobs and its first waiting
-- ones, each an index range of at most a limit's worth of rows. A job admitted
-- behind an unstarted one gets that job's order time (and due time, when later than
-- now and its own), so start order stays id order. Up to :budget lanes with nothing
-- unstarted ahead and no rate hand their next job, if due and in one of :take_queues,
-- straight to :worker ('take': admitted and claimed in one write). The last rows wake workers
-- and, with :notify_done, result waiters.
WITH RECURSIVE rules AS MATERIALIZED (  -- usually a handful of rows, read once
    SELECT * FROM ferryq_lane_rules WHERE namespace = ANY(:namespaces::text[])
), l AS (
    SELECT t.n, t.l, coalesce(r.lane_limit, 1) AS k, r.rate_n IS NOT NULL AS rated,
        h.held, h.floor_order, h.floor_due,
        h.queue_min, h.queue_max,
        EXISTS (SELECT FROM ferryq_lane_halts x WHERE x.namespace = t.n AND x.lane = t.l)
            AS halted
    FROM unnest(:namespaces::text[], :lanes::text[]) AS t(n, l)
    LEFT JOIN LATERAL (
        SELECT r.lane_limit, r.rate_n FROM rules r
        WHERE r.namespace = t.n
          AND (r.pattern = t.l OR (right(r.pattern, 1) = '*'
               AND left(t.l, length(r.pattern) - 1) = left(r.pattern, length(r.pattern) - 1)))
        ORDER BY (right(r.pattern, 1) <> '*') DESC, length(r.pattern) DESC
        LIMIT 1) r ON true
    CROSS JOIN LATERAL (
        SELECT count(*) AS held,
            max(j.order_time) FILTER (WHERE j.claimed_at IS NULL) AS floor_order,
            max(j.run_at) FILTER (WHERE j.claimed_at IS NULL AND j.state = 'scheduled')
                AS floor_due,
            min(j.queue) FILTER (WHERE j.claimed_at IS NULL) AS queue_min,
            max(j.queue) FILTER (WHERE j.claimed_at IS NULL) AS queue_max
        FROM ferryq_jobs j
        WHERE j.namespace = t.n AND j.lane = t.l AND j.state <> 'waiting') h
), steps(n, l, id, room, order_time, floor_due, first_free, run_at, queue, expires_at) AS (
    -- The first waiting jobs of each lane with room, one index step at a time (a
    -- LIMIT of the room itself would be unknown to the planner, which could then read
    -- a long lane whole), carrying along the floors the jobs before it set: its order
    -- time at least theirs, its due time at least theirs. Carried, not windowed: a
    -- window partition per lane costs more than the steps themselves.
    -- Each step reads the next entry in the order of ferryq_jobs_lane_waiting itself
    -- (namespace, lane, id), row and all, and checks it is still the lane's: asked for
    -- the lane's smallest id instead, the planner may walk the primary key in id order
    -- (one lane looks like half the table to it), through every job of a long lane.
    -- A step stops at a job of another queue than an unstarted one ahead of it, which
    -- a claim of its own queue could otherwise start first (see ferryq/lanes.py); after
    -- the first step, ahead of it is the job of the step before. Nothing is admitted
    -- behind a job held by its dependencies (due at ferryq.job.HELD, 1e15).
    SELECT l.n, l.l, w.id, l.k - l.held, greatest(l.floor_order, w.order_time), l.floor_due,
        l.floor_order IS NULL AND NOT l.rated, w.run_at, w.queue, w.expires_at
    FROM l CROSS JOIN LATERAL (
        SELECT f.id, f.run_at, f.order_time, f.queue, f.expires_at, f.namespace, f.lane
        FROM ferryq_jobs f
        WHERE f.state = 'waiting' AND (f.namespace, f.lane) >= (l.n, l.l)
        ORDER BY f.namespace, f.lane, f.id LIMIT 1) w
    WHERE NOT l.halted AND l.held < l.k AND w.namespace = l.n AND w.lane = l.l
      AND (l.queue_min IS NULL OR (l.queue_min = l.queue_max AND w.queue = l.queue_min))
      AND (l.floor_due IS NULL OR l.floor_due < 1e15)  -- not behind a held job (HELD)
    UNION ALL
    SELECT s.n, s.l, w.id, s.room - 1, greatest(s.order_time, w.order_time),
        greatest(s.floor_due, s.run_at), false, w.run_at, w.queue, w.expires_at
    FROM steps s CROSS JOIN LATERAL (
        SELECT f.id, f.run_at, f.order_time, f.queue, f.expires_at, f.namespace, f.lane
        FROM ferryq_jobs f
        WHERE f.state = 'waiting' AND (f.namespace, f.lane, f.id) > (s.n, s.l, s.id)
        ORDER BY f.namespace, f.lane, f.id LIMIT 1) w
    WHERE s.room > 1 AND w.namespace = s.n AND w.lane = s.l AND w.queue = s.queue
      AND s.run_at < 1e15
), due AS (
    SELECT id, order_time,
        CASE WHEN floor_due > :now AND floor_due > run_at THEN floor_due ELSE run_at END
            AS run_at,
        first_free AND n = :take_namespace AND queue = ANY(:take_queues::text[])
            AND (expires_at IS NULL OR expires_at > :now) AS takeable
    FROM steps
), planned AS (
    SELECT id, order_time, run_at,
        takeable AND run_at <= :now
            AND count(*) FILTER (WHERE takeable AND run_at <= :now) OVER (ORDER BY id)
                <= :budget AS take
    FROM due
), admitted AS (
    UPDATE ferryq_jobs j
    SET order_time = p.order_time, run_at = p.run_at,
        state = CASE WHEN p.take THEN 'running'
                     WHEN p.run_at > :now THEN 'scheduled' ELSE 'ready' END,
        {claim_set_if_taken}
    FROM planned p
    -- waiting: under the lane's lock nothing else moves a waiting job. The ANY keeps
    -- the update to primary-key lookups whatever the planner guesses of the steps.
    WHERE j.id = ANY(ARRAY(SELECT id FROM planned)) AND j.id = p.id
    RETURNING p.take, j.state, {claim_columns}
)
SELECT 'take', {claim_of_a} FROM admitted a WHERE a.take
UNION ALL
SELECT 'rest', {claim_nulls_but_lane} FROM l WHERE halted OR held > k
UNION ALL
SELECT pg_notify('ferryq_jobs', q.queue)::text, {claim_nulls_but_lane}
FROM (SELECT DISTINCT queue, NULL::text AS n, NULL::text AS l
      FROM admitted WHERE state = 'ready') q
UNION ALL  -- and, for finishes that settle here, the sign to result waiters
SELECT pg_notify('ferryq_done', '')::text, {claim_nulls_but_lane}
FROM (SELECT NULL::text AS n, NULL::text AS l) d WHERE :notify_done;

-- name: lane_apply
-- Admit and demote as planned (ferryq/lanes.py); wake workers for what became ready.
WITH admitted AS (
    UPDATE ferryq_jobs j SET state = a.state, run_at = a.run_at, order_time = a.order_time
    FROM unnest(:ids::bigint[], :states::text[], :run_ats::float8[], :order_times::float8[])
        AS a(id, state, run_at, order_time)
    WHERE j.id = ANY(:ids::bigint[]) AND j.id = a.id AND j.state = 'waiting'
    RETURNING j.queue, j.state
), demoted AS (
    UPDATE ferryq_jobs SET state = 'waiting'
    WHERE id = ANY(:demote::bigint[]) AND state IN ('scheduled', 'ready')
      AND claimed_at IS NULL
    RETURNING id
)
SELECT pg_notify('ferryq_jobs', q.queue)
FROM (SELECT DISTINCT queue FROM admitted WHERE state = 'ready') q;

-- name: lane_ahead
SELECT count(*) FROM ferryq_jobs
WHERE namespace = :namespace AND lane = :lane AND state = 'waiting' AND id < :id;

-- name: lane_names
-- Lanes with hot jobs whose name starts with :prefix: one index step per lane in
-- each lane index (a loose index scan), never a walk through a long lane. Every lane
-- is stepped over, as a prefix is not a range in every collation.
WITH RECURSIVE waiting(lane) AS (
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state = 'waiting' AND lane IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state = 'waiting' AND lane > w.lane)
    FROM waiting w WHERE w.lane IS NOT NULL
), held(lane) AS (
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state <> 'waiting' AND lane IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(lane) FROM ferryq_jobs
            WHERE namespace = :namespace AND state <> 'waiting' AND lane > h.lane)
    FROM held h WHERE h.lane IS NOT NULL
)
SELECT lane FROM waiting WHERE left(lane, length(:prefix)) = :prefix
UNION
SELECT lane FROM held WHERE left(lane, length(:prefix)) = :prefix;

-- name: lane_list
-- Lanes with hot jobs, busiest first: a scan of the hot table, for operators.
SELECT j.lane,
       count(*) FILTER (WHERE j.state = 'waiting') AS waiting,
       count(*) FILTER (WHERE j.state IN ('scheduled', 'ready')) AS admitted,
       count(*) FILTER (WHERE j.state = 'running') AS running,
       min(h.job_id) AS halted_by
FROM ferryq_jobs j
LEFT JOIN ferryq_lane_halts h ON h.namespace = j.namespace AND h.lane = j.lane
WHERE j.namespace = :namespace AND j.lane IS NOT NULL
GROUP BY j.lane
ORDER BY count(*) DESC, j.lane
LIMIT :limit;

-- name: job_take
-- job_claim_queue for a consumer over HTTP: the lease is the consumer's ttr, which
-- becomes the job's own, so lease renewals and explain agree with it. The attempt
-- starts when it is handed over: no worker will report a start of its own.
UPDATE ferryq_jobs j
SET {take_set}
WHERE j.id = ANY(ARRAY(
    SELECT id FROM ferryq_jobs
    WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
      AND (expires_at IS NULL OR expires_at > :now)
      AND NOT EXISTS (SELECT FROM ferryq_lane_rules  -- a rate: see job_pick
                      WHERE namespace = :namespace AND rate_n IS NOT NULL)
    ORDER BY order_time, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED))
RETURNING {job_columns};

-- name: job_ack
-- An HTTP consumer's acknowledgement has no fence: whatever unfinished state the job
-- is in, it ends succeeded. Jobs of other queues are left alone. The jobs' lanes are
-- locked by now.
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = ANY(:ids::bigint[]) AND j.namespace = :namespace AND j.queue = :queue
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM moved j
RETURNING id, namespace, lane;

-- name: queue_clear_lanes
-- The lanes that clearing the queue may free, to be locked before any job row.
SELECT DISTINCT lane FROM ferryq_jobs
WHERE state = 'ready' AND namespace = :namespace AND queue = :queue AND lane IS NOT NULL;

-- name: queue_clear
-- Cancels the queue's ready jobs. Their lanes (:lanes) are locked by now; a job that
-- a claim holds is left to it, and so is one admitted meanwhile into another lane.
WITH moved AS (
    DELETE FROM ferryq_jobs j
    WHERE j.id = ANY(ARRAY(SELECT id FROM ferryq_jobs
                   WHERE state = 'ready' AND namespace = :namespace AND queue = :queue
                     AND (lane IS NULL OR lane = ANY(:lanes::text[]))
                   FOR UPDATE SKIP LOCKED))
    RETURNING j.*
)
INSERT INTO ferryq_history ({job_columns})
SELECT {history_terminal_columns} FROM moved j
RETURNING id, namespace, lane;

-- name: periodic_upsert
-- A periodic task first seen now is handled up to now: its first tick is the next.
INSERT INTO ferryq_periodic (namespace, task, schedule, queue, catch_up, checked_until,
    updated_at)
SELECT :namespace, t.task, t.schedule, t.queue, t.catch_up, :now::float8, :now::float8
FROM unnest(:tasks::text[], :schedules::text[], :queues::text[], :catch_ups::int[])
    AS t(task, schedule, queue, catch_up)
ON CONFLICT (namespace, task) DO UPDATE SET schedule = excluded.schedule,
    queue = excluded.queue, catch_up = excluded.catch_up, updated_at = excluded.updated_at;

-- name: periodic_advance
-- Compare and set: of two leaders that planned from the same point, one moves it.
UPDATE ferryq_periodic
SET checked_until = :checked_until, next_tick = :next_tick::float8, updated_at = :now,
    last_tick = coalesce(:last_tick::float8, last_tick),
    last_job = coalesce(:last_job::bigint, last_job)
WHERE namespace = :namespace AND task = :task AND checked_until = :checked_from
RETURNING task;

-- name: migration_lock
-- One migrator at a time, however many processes start together.
SELECT pg_advisory_xact_lock(hashtextextended('ferryq:migrate', 7));

-- name: migration_table
CREATE TABLE IF NOT EXISTS ferryq_migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at double precision NOT NULL);
