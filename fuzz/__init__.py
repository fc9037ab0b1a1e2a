"""Fuzzing Islands' parsers: coverage-guided targets (fuzz/targets/, run by fuzz/run.py under
atheris) and a live fuzzer that sends mutated frames to a real syncer (fuzz/live.py)."""
