"""The checkpoint store: per-run plans, commit locks and committed positions (SQLite or PostgreSQL)."""
