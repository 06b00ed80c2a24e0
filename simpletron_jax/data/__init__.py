"""Data for the LRA tasks: ragged example storage, batching and per-task loaders."""
