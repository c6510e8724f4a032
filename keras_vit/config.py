"""Architecture configuration: what a ViT (or hybrid ResNet+ViT) is made of.

The sizes of the named variants live in `variants.py` and nowhere else; these
dataclasses only say which fields exist and what they mean.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

CLASSIFIERS = ("token", "gap")


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """The BiT-style ResNet stem of a hybrid model.

    Args:
        num_layers: bottleneck units per stage, e.g. (3, 4, 9) for the
            R50 stem of R50+ViT-B/16 (the paper drops stage 4 and moves its
            units into stage 3). Each stage after the first halves the grid.
            () is the root block alone (conv, GroupNorm, max-pool), as in
            AugReg's R+Ti/16.
        width_factor: multiplies the base width of 64 channels.
    """

    num_layers: Tuple[int, ...] = (3, 4, 9)
    width_factor: int = 1

    def __post_init__(self):
        object.__setattr__(self, "num_layers", tuple(int(n) for n in self.num_layers))
        if any(n < 1 for n in self.num_layers):
            raise ValueError(
                f"ResNetConfig.num_layers must be a tuple of positive unit counts "
                f"(() for the root block alone), got {self.num_layers!r}."
            )
        if self.width_factor < 1:
            raise ValueError(f"ResNetConfig.width_factor must be >= 1, got {self.width_factor}.")

    @property
    def width(self) -> int:
        return 64 * self.width_factor

    @property
    def stride(self) -> int:
        """Total downsampling: root conv (2) * max-pool (2) * one 2 per stage after the first."""
        return 4 * 2 ** max(len(self.num_layers) - 1, 0)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer's architecture.

    Args:
        patch_size: side of the square patches (on the ResNet's feature map for
            a hybrid, where it is usually 1).
        hidden_size: token width D.
        mlp_dim: hidden width of each block's MLP.
        num_heads: attention heads; must divide `hidden_size`.
        num_layers: encoder blocks.
        classifier: "token" (a learned class token is prepended and read out)
            or "gap" (global average of the patch tokens, no class token).
        representation_size: width of the pre-logits layer (Dense + tanh) the
            paper uses for pre-training; None drops it (the fine-tuning setup).
        resnet: a ResNetConfig for a hybrid model, else None.
        dropout_rate: dropout after the position embedding, attention output
            and each MLP dense layer.
        attention_dropout_rate: dropout on the attention probabilities.
        stochastic_depth_rate: drop-path rate of the last block; block i uses
            rate * i / (num_layers - 1).
        layer_norm_epsilon: epsilon of every LayerNorm: 1e-6 in the official
            code (and timm, keras-hub), 1e-12 in HF transformers' ViT.
        gelu_approximate: the MLP's GELU: True is the tanh approximation of
            the official code, False the exact (erf) GELU of HF transformers
            (hidden_act="gelu"), timm and keras-hub. A checkpoint reproduces
            its source's outputs only with its source's choice.
    """

    patch_size: int
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    classifier: str = "token"
    representation_size: Optional[int] = None
    resnet: Optional[ResNetConfig] = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    gelu_approximate: bool = True

    def __post_init__(self):
        if isinstance(self.resnet, dict):
            object.__setattr__(self, "resnet", ResNetConfig(**self.resnet))
        if self.classifier not in CLASSIFIERS:
            raise ValueError(
                f"classifier must be one of {CLASSIFIERS}, got {self.classifier!r}."
            )
        for field in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"ViTConfig.{field} must be a positive integer, got {getattr(self, field)!r}.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})."
            )
        for field in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ValueError(f"ViTConfig.{field} must be in [0, 1), got {getattr(self, field)!r}.")
        if not 0.0 < float(self.layer_norm_epsilon) < 1.0:
            raise ValueError(f"ViTConfig.layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon!r}.")
        object.__setattr__(self, "layer_norm_epsilon", float(self.layer_norm_epsilon))
        object.__setattr__(self, "gelu_approximate", bool(self.gelu_approximate))

    @property
    def total_stride(self) -> int:
        """Pixels per token side: the patch size times the ResNet's downsampling."""
        return self.patch_size * (self.resnet.stride if self.resnet else 1)

    def replace(self, **changes) -> "ViTConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(
                f"Unknown ViTConfig field(s) {sorted(unknown)}; valid fields are "
                f"{[f.name for f in dataclasses.fields(self)]}."
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.resnet is not None:
            d["resnet"]["num_layers"] = list(self.resnet.num_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ViTConfig":
        return cls(**d)
