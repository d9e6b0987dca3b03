"""Support code for the tests: local servers that only tests start."""
