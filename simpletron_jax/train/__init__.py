"""Training and evaluation: the typed run config, the train state and steps, the loop and its
periodic actions, checkpoints and the final tests (the run's safety and logs: ``run``).

``trainer.train_and_evaluate`` is what ``train.py`` runs. This package imports the model,
data and runtime packages, never the tools.
"""
