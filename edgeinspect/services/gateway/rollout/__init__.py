"""Model versions at run time: the candidate in shadow, canary stations, promote and rollback."""
