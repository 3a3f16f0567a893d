"""The refinery service: the merge queue."""
