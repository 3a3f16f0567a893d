"""The runner's effects: fetching a job's candidate and running its gates (``job_run``, blocking)."""
