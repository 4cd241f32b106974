"""Test helpers that are real modules: the fork server, child programs the tests run, waits."""
