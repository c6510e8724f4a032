"""Seeing inside a ViT: predictions, attention maps and the paper's figures."""
