"""coschedule: keep the pods of one workflow run on one node."""
