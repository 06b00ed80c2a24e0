"""What surrounds a training run: its safety and its logs.

The workdir lock, finiteness checks and state CRCs (``run_guard``), SIGTERM handling
(``preemption``), what a run was computed with (``run_record``, ``software_record``), and its
logs: ``metrics.jsonl``, TensorBoard and W&B (``metric_logging``, ``tensorboard_writer``,
``wandb_writer``) and profiler traces (``profiling``). It imports the runtime package only.
"""
