"""timm's layouts: its `VisionTransformer` and `Eva` state dicts, families, hybrids, config, writer."""
