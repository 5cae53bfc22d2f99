"""The records and the command line: the workdir, checkpoints and their ledger, signals, the memory
check, the dry run, the report, the pipeline that runs a method through them, sweeps, the benchmark
and `run.py`'s command line. Above every module outside run/ (the method and its data), which never
imports it."""
