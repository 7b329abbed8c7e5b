"""Bearer-token authentication by role, node binding of ingest tokens, and the audit log."""
