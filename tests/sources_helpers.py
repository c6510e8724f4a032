"""Shared by the checkpoint-source tests: real photos and weight perturbation."""

import numpy as np
import torch
from PIL import Image


def photos(size, count=2):
    """sklearn's two sample photographs (china.jpg, flower.jpg), resized and scaled to [-1, 1], NHWC."""
    from sklearn.datasets import load_sample_images

    images = load_sample_images().images[:count]
    out = [np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR), np.float32) for im in images]
    return np.stack(out) / 127.5 - 1.0


def perturb_torch(module, seed, scale=0.2):
    """Random values for every parameter (fresh models have constant LayerNorms and biases)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * scale)


def perturb_keras(model, seed, scale=0.2):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign((rng.normal(size=variable.shape) * scale).astype(np.float32))


def torch_logits(module, images, attribute="logits"):
    with torch.no_grad():
        out = module(pixel_values=torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))))
    return getattr(out, attribute).numpy() if isinstance(attribute, str) else attribute(out).numpy()
