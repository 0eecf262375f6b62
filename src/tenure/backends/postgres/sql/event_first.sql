-- The kept event of a topic with a publisher-given id (a publish found it
-- committed by a concurrent publish after its own snapshot was taken).
SELECT body FROM {events} WHERE topic = %(topic)s AND source_id = %(source)s
