-- The migrations a file has been through (0: created by a version before them).
PRAGMA user_version
