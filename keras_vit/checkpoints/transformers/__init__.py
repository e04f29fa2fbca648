"""transformers' layouts: ViT, CLIP/SigLIP vision towers, DINOv2, DINOv3."""
