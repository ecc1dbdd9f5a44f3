"""Work as tenants submit and see it: spec types, their conversion to the scheduler's
types, explanations, and the REST representations the CLI decodes too."""
