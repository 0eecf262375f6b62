-- Append items at the stream's next positions, only while the writer holds the
-- lease with this token, prune by retention and wake the readers: one statement.
-- FOR SHARE keeps the lease row as checked until the commit: a takeover (an
-- UPDATE of that row) waits for this append, so a stale item is never stored
-- after the successor's first. Result: the last position (NULL: fenced).
WITH fence AS (
    SELECT 1 FROM {table}
    WHERE key = %(key)s AND owner = %(owner)s AND token = %(token)s AND deadline > {now}()
    FOR SHARE
), base AS (
    SELECT COALESCE(max(pos), 0) AS last FROM {output} WHERE stream = %(stream)s
), added AS (
    INSERT INTO {output} (stream, pos, body, at)
    SELECT %(stream)s, base.last + b.n, b.body, {now}()
    FROM fence, base, unnest(%(bodies)s::text[]) WITH ORDINALITY AS b(body, n)
    -- A batch longer than the count kept stores only its tail (its first
    -- positions count as pruned); the last position is always stored.
    WHERE b.n > %(count)s - %(max_items)s
    RETURNING pos
), pruned AS (
    -- One range of the primary key: items are stored in time order, so the aged
    -- ones are those before the first kept item, found by walking from the
    -- oldest (which stops at once when nothing has aged). A condition on "at"
    -- over the whole stream would read every item it keeps on every append.
    DELETE FROM {output}
    WHERE stream = %(stream)s AND EXISTS (SELECT 1 FROM fence)
      AND pos <= (SELECT last FROM base)
      AND pos < GREATEST(
          (SELECT last FROM base) + %(count)s - %(max_items)s + 1,
          COALESCE((SELECT o.pos FROM {output} AS o
                    WHERE o.stream = %(stream)s
                      AND o.at >= {now}() - %(max_age)s * interval '1 second'
                    ORDER BY o.pos LIMIT 1),
                   (SELECT last FROM base) + 1))
)
SELECT (SELECT max(pos) FROM added),
       (SELECT count(pg_catalog.pg_notify(%(channel)s, %(payload)s)) FROM fence)
