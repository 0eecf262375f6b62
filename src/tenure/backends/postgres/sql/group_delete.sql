-- Forget a private (fan-out) group and its claims.
WITH claims AS (DELETE FROM {claims} WHERE group_id = %(id)s)
DELETE FROM {groups} WHERE id = %(id)s AND private
