"""Training and evaluation: the config checks, the train state and steps, the loop and its
periodic actions, checkpoints, preemption, the run record and the metric writers.

``trainer.train_and_evaluate`` is what ``train.py`` runs. This package imports the model,
data and runtime packages, never the tools.
"""
