"""Work as tenants see it: the REST spec types, their conversion to the scheduler's
types, explanations, job logs, the event stream and the CLI client."""
