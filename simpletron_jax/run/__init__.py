"""What surrounds a training run: the workdir lock and state checks, SIGTERM handling, the run
record, and its logs (metrics.jsonl, TensorBoard, W&B, profiler traces). It imports only
``simpletron_jax.runtime``."""
