"""Who may act, and what was done: tenants' bearer tokens and the admin's audit log."""
