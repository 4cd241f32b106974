"""Child programs the tests run in their own processes (`python -m tests.programs.NAME ARGS`), linted and typed like the rest."""
