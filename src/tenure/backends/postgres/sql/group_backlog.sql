-- backlog: the topics in [low, high) whose named group has claims not yet
-- acknowledged (unread or in flight). One pass over the claims in flight;
-- idle topics and their groups cost nothing.
SELECT DISTINCT g.topic
FROM {claims} AS c JOIN {groups} AS g ON g.id = c.group_id
WHERE g.name = %(name)s AND NOT g.private AND g.topic >= %(low)s AND g.topic < %(high)s
