-- The stream's last position (0: none yet) and up to a limit of items after a
-- position, in order, from one snapshot (one row with NULLs when none).
SELECT h.head, o.pos, o.body
FROM (SELECT COALESCE(max(pos), 0) AS head FROM {output} WHERE stream = %(stream)s) AS h
LEFT JOIN LATERAL (
    SELECT pos, body FROM {output}
    WHERE stream = %(stream)s AND pos > %(after)s
    ORDER BY pos LIMIT %(limit)s
) AS o ON true
