"""The parts of `scripts/gpu_check.py` (`make gpu-check`), one file per phase; the script's docstring says what each
phase measures. Only the standard library is imported at the top of each part: torch, numpy and the project come
in inside the phases, once `common.setup_paths` has put this checkout and the carried packages on the path."""
