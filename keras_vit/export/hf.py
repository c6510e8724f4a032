"""`--formats hf`: an HF transformers ViT directory (config.json, model.safetensors,
preprocessor_config.json) written by keras_vit.save_pretrained (as one unit,
keras_vit.utils.storage.writing_directory), validated like the other formats:
loaded by transformers.ViTForImageClassification in a fresh process
(runner.py imports torch and transformers only) and compared with Keras.
Built only when named: its validation needs the `reference` extra."""

from __future__ import annotations

from keras_vit.errors import UserError, require
from keras_vit.export.format import Build, ExportFormat


def check(model):
    """Refuses, before anything is built, what HF's ViT cannot express or run here."""
    from keras_vit.weights.hf import hf_config

    require("torch", "reference", "Validating the hf export (transformers runs it)")
    require("transformers", "reference", "Validating the hf export")
    if not hasattr(model, "config") or not hasattr(model, "include_top"):
        raise UserError(f"{model.name} is not a keras_vit.ViT; only those are written as HF checkpoints.")
    if not model.include_top:
        raise UserError(f"{model.name} has no head (include_top=False): export classifies, write the features "
                         f"model with keras_vit.save_pretrained(model, DIR) instead.")
    hf_config(model)


def write(model, labels, path):
    from keras_vit.weights.hf import save_pretrained

    save_pretrained(model, path, labels=list(labels))
    return {"architecture": "ViTForImageClassification",
            "hidden_act": "gelu_pytorch_tanh" if model.config.gelu_approximate else "gelu",
            "layer_norm_eps": model.config.layer_norm_epsilon}


def _build(job: Build):
    return write(job.model, job.labels, job.path)


EXPORT_FORMATS = (ExportFormat(
    name="hf",
    description="HF transformers ViT directory (ViTForImageClassification), run by transformers",
    layout="{name}-hf",
    runtime="hf",
    build=_build,
    check=check,
    default=False,
    extra="reference",
    refuses_quantized="transformers' ViT holds float weights: export the float model it was quantised from",
),)
