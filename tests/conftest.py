"""Repository-wide test setup. pytest puts this directory on sys.path, so shared helpers
(``procs``) import as top-level modules from any test file."""
