"""What every layer of the package shares: one-line errors, atomic writes, the command line
and its overrides, platforms, hosts, the compilation cache and the progress display.

Nothing here imports another package of simpletron_jax.
"""
