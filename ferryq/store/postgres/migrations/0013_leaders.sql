-- Leadership as a lease row, for a store behind a transaction pooler (?pooler=transaction),
-- where a session advisory lock would be held by whichever server connection the pooler
-- lent, not by the worker (docs/operations.md, "Behind a connection pooler"). One row per
-- leadership (maintenance, periodic): held by one worker until it expires, as on SQLite.
-- Elsewhere leadership stays the advisory lock, and the table stays empty.
CREATE TABLE IF NOT EXISTS ferryq_leaders (
    name       text             PRIMARY KEY,
    holder     text             NOT NULL,
    expires_at double precision NOT NULL
);
