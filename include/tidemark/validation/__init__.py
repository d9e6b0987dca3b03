"""Validation inside the job: expectation rules, range completeness checks and the feed's GX suite."""
