"""ml_collections configs, one folder per LRA task: ``configs/<task>/<model>.py``."""
