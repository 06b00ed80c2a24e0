"""simpletron-jax: SimpleTRON and efficient-attention baselines on Long Range Arena."""

__version__ = "0.1.0"
