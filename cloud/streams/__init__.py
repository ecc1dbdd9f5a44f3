"""What streams to clients: the event hub behind `/v1/events` and the job-log store
behind `/v1/jobs/{id}/logs`."""
