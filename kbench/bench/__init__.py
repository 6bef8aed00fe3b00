"""Running the case declarations: targets and queue configurations, the runner (worker
subprocesses with per-case time limits), timing, peak measurements, expectations and the
CUDA peer."""
