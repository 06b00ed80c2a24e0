"""The model: the attention registry and its variants, the encoder blocks, the classifiers.

``attention/`` holds one module per attention family and the registry; ``layers`` the
positions, MLP and encoder block; ``encoders`` the typed model config, the encoders and the
classification heads; ``transfer`` and ``lora`` transform parameter trees. Nothing here
imports the data, training or tool packages.
"""
