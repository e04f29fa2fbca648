"""Published checkpoints: the named registry and the download cache."""
