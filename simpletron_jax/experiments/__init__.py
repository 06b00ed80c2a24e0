"""The experiment layer: every fact of the published experiments, in one place.

* :mod:`~simpletron_jax.experiments.recipes`: one :class:`TaskRecipe` per task (the published
  model and optimisation, the ``:variant`` sizes, LRA's per-baseline settings and bugs on the
  task, SimpleTRON's appendix A settings, the self-pretraining recipes);
* :mod:`~simpletron_jax.experiments.attentions`: one :class:`AttentionRecipe` per attention
  (the LRA baseline it reproduces, the options LRA's code ran and the options of its bugs,
  whether it is a SimpleTRON paper variant, the options the configs tie to the pooling or the
  length, the map ``scripts/explain.py`` draws);
* :mod:`~simpletron_jax.experiments.published`: the published accuracies (LRA's Table 1, the
  SimpleTRON paper's) and the reference rows, with their sources and protocols.

``configs/lra.py`` builds every config from these records and the data and attention
registries; in the package, :mod:`simpletron_jax.train.pretraining` reads the SPT recipes,
:mod:`simpletron_jax.tools.explain` the map method and :mod:`simpletron_jax.tools.reporting`
the published accuracies. The records import the data and model registries, never ``train``
or ``tools``.
"""
