"""The model: the attention registry and its variants, the encoder blocks, the classifiers.

``attention/`` holds one module per attention family and the registry; ``layers`` the
positions, MLP and encoder block; ``model_config`` the typed model config and its checks;
``encoders`` the encoders, the classification heads and their builders; ``transfer`` and
``lora`` transform parameter trees. Nothing here imports the data, training or tool
packages.
"""
