"""The contract tests run against files in ``tmp_path`` only; see cases_paths.py and cases_bounds.py."""
