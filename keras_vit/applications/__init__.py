"""`ViT`, the named variants and `from_pretrained`: models with or without checkpoint weights."""
