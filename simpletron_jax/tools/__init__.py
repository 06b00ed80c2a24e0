"""Tools built on the trained model, above the training code: the TPU compile check
(``tpu_aot``), the BERT import, attention maps and relevance (``explain``), run reports and
the published numbers they are compared with.
"""
