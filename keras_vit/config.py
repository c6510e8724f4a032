"""Architecture configuration: what a ViT (or hybrid ResNet+ViT) is made of.

The sizes of the named variants live in `variants.py` and nowhere else; these
dataclasses only say which fields exist and what they mean.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from keras_vit.errors import UserError

# How one vector per image is read out of the encoded tokens (keras_vit.layers.pooling):
# the class token; the mean of the tokens; SigLIP's attention-pooling (MAP) head; DINOv2's
# classifier input, the class token next to the mean of the patch tokens (2 * D); or AIMv2's
# attention pooling (keras_vit.layers.AttentionPoolingHead: a query, key/value, one projection).
CLASSIFIERS = ("token", "gap", "map", "token_gap", "attention_pool")
# The kind of every norm in the model: LayerNorm, or AIMv2's RMSNorm (keras_vit.layers.normalization).
NORMS = ("layer_norm", "rms_norm")
# The MLP of every block: GELU (tanh or exact, by gelu_approximate), CLIP's
# x * sigmoid(1.702 x), or DINOv2's gated SiLU unit.
MLP_ACTIVATIONS = ("gelu", "quick_gelu", "swiglu")
# Where the final LayerNorm sits: on every token (ViT, DeiT, DINOv2, SigLIP), on the
# pooled vector only (CLIP's post_layernorm), or nowhere (CLIPForImageClassification's
# classifier reads the encoder's tokens before post_layernorm).
FINAL_NORMS = ("tokens", "pooled", "none")
# How a learned position table is resized to another grid: the official loader's
# linear (corners aligned), or each family's own torch code (keras_vit.layers.interpolation).
POSITION_INTERPOLATIONS = ("linear", "bicubic", "bicubic_antialias", "bilinear_antialias")
# What pixels a model's weights expect (keras_vit.images.NORMALIZATIONS).
PIXEL_NORMALIZATIONS = ("minus_one_to_one", "imagenet", "clip")
# How patch positions reach the encoder (the paper's Appendix D.4, plus the
# fixed sin-cos table of MAE / big_vision, DINOv3's rotary embedding). Only
# "learned_1d" fits the official checkpoint layout; the others are saved as
# `.keras` files (and "rope" read from DINOv3 checkpoints).
# An encoder block's projections ("mlp": both MLP layers): what ViTConfig.projection_biases
# names, and what LoRA can adapt, with its default: the LoRA paper's (Sec. 7.1: W_q and W_v)
# and peft's image-classification guide's for ViT (target_modules=["query", "value"]).
PROJECTIONS = ("query", "key", "value", "out", "mlp")
LORA_TARGETS = PROJECTIONS
DEFAULT_LORA_TARGETS = ("query", "value")
# Integer projections in the encoder blocks (keras_vit.layers.quantization): Keras' own int8
# (per-channel weights, per-token activations) and int4 (weights only, groups of 128 input
# rows). Not Keras' float8: it is float8 *training* (float32 weights, scales learned as it
# trains, for GPUs with float8 matmuls), keras_vit.model.quantization.check_mode says so.
QUANTIZATION_MODES = ("int8", "int4")


def lora_targets(targets) -> Tuple[str, ...]:
    """LoRA targets as a tuple: a sequence of names, or one string of names joined by commas."""
    if isinstance(targets, str):
        return tuple(t.strip() for t in targets.split(",") if t.strip())
    return tuple(targets)


POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "relative", "rope", "none")


def lora_alpha_value(alpha) -> float:
    """lora_alpha as a float, refused in one line naming the flag (from the command line) and
    the fix where it is no positive number (0 would silence every update)."""
    from keras_vit.utils.console import either

    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:  # NaN too
        raise UserError(f"{either('--lora-alpha', 'lora_alpha')} must be positive, got {alpha!r}: give a positive "
                        f"number (the updates' scale is alpha / rank), or leave it out to use the rank.")
    return value


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
            raise UserError(
                f"ResNetConfig.num_layers must be a tuple of positive unit counts "
                f"(() for the root block alone), got {self.num_layers!r}."
            )
        if self.width_factor < 1:
            raise UserError(f"ResNetConfig.width_factor must be >= 1, got {self.width_factor}.")

    @property
    def width(self) -> int:
        """Channels of the root block: 64 times width_factor (BiT's R50x1 = 64)."""
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
            or "gap" (global average of the patch tokens; no class token unless
            class_token=True).
        class_token: whether a learned class token is prepended; None (the
            default) for classifier "token" and "token_gap", which read it,
            and no other. True with "gap" is timm's DINOv3 (global_pool="avg"):
            the class token takes part in attention, the mean of the patch
            tokens is read out.
        representation_size: width of the pre-logits layer (Dense + tanh) the
            paper uses for pre-training; None drops it (the fine-tuning setup).
        resnet: a ResNetConfig for a hybrid model, else None.
        dropout_rate: dropout after the position embedding, attention output
            and each MLP dense layer.
        attention_dropout_rate: dropout on the attention probabilities.
        stochastic_depth_rate: drop-path rate of the last block; block i uses
            rate * i / (num_layers - 1).
        patch_dropout: fraction of the patch tokens left out at random in
            training (keras_vit.layers.PatchDropout); inference keeps all.
        layer_norm_epsilon: epsilon of every LayerNorm: 1e-6 in the official
            code (and timm, keras-hub), 1e-12 in HF transformers' ViT.
        gelu_approximate: the MLP's GELU: True is the tanh approximation of
            the official code, False the exact (erf) GELU of HF transformers
            (hidden_act="gelu"), timm and keras-hub. A checkpoint reproduces
            its source's outputs only with its source's choice.
        position_embedding: how the encoder learns where each patch is:
            "learned_1d" (the paper's and every official checkpoint's: one
            learned vector per token), "learned_2d" (the paper's App. D.4
            2-D variant: a learned column and a learned row table of D/2
            each, concatenated), "sincos_2d" (fixed sin-cos of the column
            and row, as in MAE and big_vision; no weights, any resolution),
            "relative" (a learned per-head bias of the attention logits for
            each 2-D offset between patches, in every block), "rope" (DINOv3's
            2-D rotary embedding: every block turns the patch tokens' queries
            and keys by angles of their centre in [-1, 1] per axis; no weights,
            any size or aspect ratio; keras_vit.layers.RotaryEmbedding2D) or
            "none" (a bag of patches).
        num_register_tokens: DINOv2's registers: learned tokens after the
            class token, added after the position embedding (unpositioned).
        distillation_token: DeiT's second prefix token (positioned).
        distillation_head: DeiT's second head on the distillation token;
            the logits are the mean of the two heads' (as transformers).
        layer_scale_init: initial value of a LayerScale on both residual
            branches of every block (DINOv2: 1.0); None: no LayerScale.
        mlp_activation: "gelu" (tanh or exact by gelu_approximate),
            "quick_gelu" (CLIP) or "swiglu" (DINOv2-g: mlp_dim is the gated
            unit's width; Dense_0 holds the gate, then the value).
        pre_norm: a LayerNorm on the tokens before the encoder (CLIP).
        patch_bias: the patch embedding's bias (CLIP has none).
        final_norm: "tokens" (LayerNorm on every encoded token), "pooled"
            (on the pooled vector only: CLIP's post_layernorm) or "none"
            (CLIPForImageClassification: its classifier reads the tokens as
            the last block leaves them).
        projection_size: a bias-free projection of the pooled vector (CLIP's
            visual projection to the joint embedding); None: none.
        position_interpolation: how learned position weights are resized to
            another grid, at load and in a dynamic model: "linear" (the
            official loader's), "bicubic" (torch's, as DeiT, CLIP, SigLIP and
            DINOv2 do), "bicubic_antialias" (DINOv2 with registers) or
            "bilinear_antialias" (SigLIP2, which resizes its table to each
            image's own grid: keras_vit.model.naflex).
        pixel_normalization: the pixels the weights expect:
            "minus_one_to_one" (the paper's and SigLIP's [-1, 1]),
            "imagenet" (DeiT, DINOv2: ImageNet mean/std) or "clip" (CLIP's
            mean/std); keras_vit.images.NORMALIZATIONS holds the numbers.
        rope_theta: the base of the rotary embedding's frequencies (DINOv3's
            100); read only with position_embedding="rope".
        rope_shift: DINOv3's augmentation of the rotary coordinates in
            training (transformers' pos_embed_shift): a uniform shift in
            [-shift, shift] per axis, one draw per step
            (keras_vit.layers.RotaryEmbedding2D). None: off. Inference
            never moves the coordinates.
        rope_jitter: the same for pos_embed_jitter: a log-uniform factor in
            [1/jitter, jitter] per axis.
        rope_rescale: the same for pos_embed_rescale (DINOv3 trained with 2):
            one log-uniform factor in [1/rescale, rescale] for both axes.
        lora_rank: LoRA fine-tuning (Hu et al. 2021): a rank-r update
            alpha/r * B A beside each projection of every block that
            `lora_targets` names (keras_vit.layers.LowRankUpdate), and every
            other weight but the classification head frozen
            (keras_vit.model.lora); 0: none.
        lora_alpha: the updates' scale is lora_alpha / lora_rank; None: the
            rank (a scale of 1).
        lora_targets: among LORA_TARGETS ("query", "key", "value", "out",
            "mlp"); default ("query", "value").
        quantization: None (float), or one of QUANTIZATION_MODES: the
            encoder blocks' projections hold their weights in that form
            (keras_vit.quantize makes such a model from a float one); the
            rest (patch embedding, tokens, norms, heads) stays float.
        norm: "layer_norm" (every family but one) or "rms_norm" (AIMv2):
            the kind of every norm of the model (blocks, final, pre-norm,
            pooled, patch norm), each with layer_norm_epsilon.
        patch_norm: a norm on the patch tokens right after the patch
            embedding, before the positions (AIMv2).
        projection_biases: the block projections among PROJECTIONS
            ("query", "key", "value", "out", "mlp") that have a bias: all
            (default), none in AIMv2 (qkv_bias=False, mlp_bias=False).
    """

    patch_size: int
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    classifier: str = "token"
    class_token: Optional[bool] = None
    representation_size: Optional[int] = None
    resnet: Optional[ResNetConfig] = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    patch_dropout: float = 0.0
    layer_norm_epsilon: float = 1e-6
    gelu_approximate: bool = True
    position_embedding: str = "learned_1d"
    num_register_tokens: int = 0
    distillation_token: bool = False
    distillation_head: bool = False
    layer_scale_init: Optional[float] = None
    mlp_activation: str = "gelu"
    pre_norm: bool = False
    patch_bias: bool = True
    final_norm: str = "tokens"
    projection_size: Optional[int] = None
    position_interpolation: str = "linear"
    pixel_normalization: str = "minus_one_to_one"
    rope_theta: float = 100.0
    rope_shift: Optional[float] = None
    rope_jitter: Optional[float] = None
    rope_rescale: Optional[float] = None
    lora_rank: int = 0
    lora_alpha: Optional[float] = None
    lora_targets: Tuple[str, ...] = DEFAULT_LORA_TARGETS
    quantization: Optional[str] = None
    norm: str = "layer_norm"
    patch_norm: bool = False
    projection_biases: Tuple[str, ...] = PROJECTIONS

    def __post_init__(self):
        if isinstance(self.resnet, dict):
            object.__setattr__(self, "resnet", ResNetConfig(**self.resnet))
        if self.classifier not in CLASSIFIERS:
            raise UserError(
                f"classifier must be one of {CLASSIFIERS}, got {self.classifier!r}."
            )
        for field in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers"):
            if int(getattr(self, field)) < 1:
                raise UserError(f"ViTConfig.{field} must be a positive integer, got {getattr(self, field)!r}.")
        if self.hidden_size % self.num_heads:
            raise UserError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads})."
            )
        for field in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate", "patch_dropout"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise UserError(f"ViTConfig.{field} must be in [0, 1), got {getattr(self, field)!r}.")
        if not 0.0 < float(self.layer_norm_epsilon) < 1.0:
            raise UserError(f"ViTConfig.layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon!r}.")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise UserError(f"ViTConfig.position_embedding must be one of {POSITION_EMBEDDINGS}, got "
                            f"{self.position_embedding!r}.")
        if self.patch_dropout and self.position_embedding == "relative":
            raise UserError("patch_dropout needs a position embedding added to the tokens: the relative position "
                            "bias is a table over the whole grid. Use another position_embedding.")
        # Both 2-D tables split the width in halves (column, row); sin-cos splits each half again.
        divisor = {"learned_2d": 2, "sincos_2d": 4}.get(self.position_embedding, 1)
        if self.hidden_size % divisor:
            raise UserError(f"position_embedding={self.position_embedding!r} needs hidden_size divisible by "
                            f"{divisor}, got {self.hidden_size}: change hidden_size or the position embedding.")
        self._check_rope()
        self._check_lora()
        if self.quantization is not None and self.quantization not in QUANTIZATION_MODES:
            raise UserError(f"quantization must be None or one of {', '.join(QUANTIZATION_MODES)}, got "
                            f"{self.quantization!r}.")
        self._check_family_fields()
        biases = lora_targets(self.projection_biases)  # a sequence of names, or one string of them
        if set(biases) - set(PROJECTIONS):
            raise UserError(f"projection_biases {list(biases)} names unknown projections: choose among "
                            f"{', '.join(PROJECTIONS)}.")
        object.__setattr__(self, "projection_biases", tuple(p for p in PROJECTIONS if p in biases))
        object.__setattr__(self, "layer_norm_epsilon", float(self.layer_norm_epsilon))
        object.__setattr__(self, "gelu_approximate", bool(self.gelu_approximate))

    def _check_rope(self):
        if self.position_embedding != "rope":
            augmented = [f for f in ("rope_shift", "rope_jitter", "rope_rescale") if getattr(self, f) is not None]
            if augmented:
                raise UserError(f"{', '.join(augmented)} augment rotary positions: set position_embedding='rope' "
                                f"or leave them None.")
            return
        head_dim = self.hidden_size // self.num_heads
        if head_dim % 4:
            raise UserError(f"position_embedding='rope' turns each head's channels in 4 parts (2 axes x sin/cos "
                            f"pairs): the head width hidden_size/num_heads = {head_dim} must be divisible by 4.")
        if self.patch_dropout:
            from keras_vit.utils.console import argument

            raise UserError(f"patch_dropout drops patch tokens, whose rotary angles (position_embedding='rope', "
                            f"DINOv3's) follow the whole grid: use {argument('patch_dropout', 0)}.")
        if not float(self.rope_theta) > 0:
            raise UserError(f"ViTConfig.rope_theta must be positive, got {self.rope_theta!r}.")
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        for field, least in (("rope_shift", 0.0), ("rope_jitter", 1.0), ("rope_rescale", 1.0)):
            value = getattr(self, field)
            if value is not None:
                if not float(value) >= least:
                    raise UserError(f"ViTConfig.{field} must be None or at least {least:g} (a range [-v, v], or "
                                    f"[1/v, v] for a factor), got {value!r}.")
                object.__setattr__(self, field, float(value))

    def _check_lora(self):
        from keras_vit.utils.console import argument, either

        targets = lora_targets(self.lora_targets)
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if unknown or not targets:
            raise UserError(f"lora_targets {list(targets)} are not projections LoRA adapts: choose among "
                            f"{', '.join(LORA_TARGETS)}, e.g. {argument('lora_targets', ('query', 'value'))}.")
        object.__setattr__(self, "lora_targets", tuple(t for t in LORA_TARGETS if t in targets))
        rank = int(self.lora_rank)
        # The smallest side of an adapted projection: D x D in attention, D x mlp_dim in the MLP.
        side = min(self.hidden_size, self.mlp_dim) if "mlp" in self.lora_targets else self.hidden_size
        if rank < 0 or rank > side:
            raise UserError(f"{either('--lora-rank', 'lora_rank')} {rank} does not fit the projections it adapts ({', '.join(self.lora_targets)}"
                            f": the smallest is {side} wide): choose a rank from 1 to {side} (LoRA's usual: 4 to 16).")
        object.__setattr__(self, "lora_rank", rank)
        if self.lora_alpha is not None:
            object.__setattr__(self, "lora_alpha", lora_alpha_value(self.lora_alpha))

    @property
    def lora(self) -> Optional[dict]:
        """The layers' LoRA setting {"rank", "alpha", "targets"}, or None without LoRA."""
        if not self.lora_rank:
            return None
        return {"rank": self.lora_rank, "alpha": self.lora_alpha or float(self.lora_rank),
                "targets": list(self.lora_targets)}

    def _check_family_fields(self):
        for field, allowed in (("mlp_activation", MLP_ACTIVATIONS), ("final_norm", FINAL_NORMS),
                               ("position_interpolation", POSITION_INTERPOLATIONS),
                               ("pixel_normalization", PIXEL_NORMALIZATIONS), ("norm", NORMS)):
            if getattr(self, field) not in allowed:
                raise UserError(f"ViTConfig.{field} must be one of {allowed}, got {getattr(self, field)!r}.")
        if int(self.num_register_tokens) < 0:
            raise UserError(f"ViTConfig.num_register_tokens must be >= 0, got {self.num_register_tokens!r}.")
        object.__setattr__(self, "num_register_tokens", int(self.num_register_tokens))
        for field in ("distillation_token", "distillation_head", "pre_norm", "patch_bias", "patch_norm"):
            object.__setattr__(self, field, bool(getattr(self, field)))
        if self.distillation_head and not self.distillation_token:
            raise UserError("distillation_head=True reads the distillation token: also set distillation_token=True.")
        if self.class_token is False and self.classifier in ("token", "token_gap"):
            raise UserError(f"classifier={self.classifier!r} reads the class token: leave class_token at None (or "
                            f"True), or pool another way (classifier='gap').")
        if self.distillation_token and self.classifier != "token":
            raise UserError(f"distillation_token=True sits after a class token: use classifier='token' (not "
                            f"{self.classifier!r}).")
        if self.final_norm == "pooled" and self.classifier == "map":
            raise UserError("final_norm='pooled' normalises the pooled vector, which the MAP head already ends in a "
                            "LayerNorm for: use final_norm='tokens' with classifier='map'.")
        if self.layer_scale_init is not None:
            object.__setattr__(self, "layer_scale_init", float(self.layer_scale_init))
        for field in ("projection_size", "representation_size"):
            value = getattr(self, field)
            if value is not None and int(value) < 1:
                raise UserError(f"ViTConfig.{field} must be a positive integer or None, got {value!r}.")

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch grid in the encoder's sequence: the class
        token (has_class_token), the distillation token,
        the registers."""
        return self.num_positioned_prefix_tokens + self.num_register_tokens

    @property
    def num_positioned_prefix_tokens(self) -> int:
        """Prefix tokens that have a row in the position table (class and
        distillation tokens; registers are added after the positions)."""
        return int(self.has_class_token) + int(self.distillation_token)

    @property
    def has_class_token(self) -> bool:
        """A learned class token leads the sequence (class_token, or by default the classifiers that read it)."""
        if self.class_token is None:
            return self.classifier in ("token", "token_gap")
        return bool(self.class_token)

    @property
    def total_stride(self) -> int:
        """Pixels per token side: the patch size times the ResNet's downsampling."""
        return self.patch_size * (self.resnet.stride if self.resnet else 1)

    def replace(self, **changes) -> "ViTConfig":
        """A copy with the given fields changed; an unknown field name is a UserError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise UserError(
                f"Unknown ViTConfig field(s) {sorted(unknown)}; valid fields are "
                f"{[f.name for f in dataclasses.fields(self)]}."
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as plain JSON-ready values (the ResNet stages as a list)."""
        d = dataclasses.asdict(self)
        if self.resnet is not None:
            d["resnet"]["num_layers"] = list(self.resnet.num_layers)
        d["lora_targets"] = list(self.lora_targets)
        d["projection_biases"] = list(self.projection_biases)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ViTConfig":
        """The config `to_dict` wrote (fields added since are at their
        defaults in older files, which is what those models were)."""
        return cls(**d)


# How a text tower reads one vector off its tokens: the last position (SigLIP, which pads to
# its full length), the first end-of-text token (CLIP), or the largest id (CLIP files from
# before transformers' PR 24773, whose eos_token_id of 2 is wrong: the end token has the largest id).
TEXT_POOLINGS = ("last", "eos", "max_id")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The text tower of an image-text model (SigLIP, SigLIP2, CLIP, MetaCLIP 2): tokens and
    learned positions, pre-LayerNorm encoder blocks (causal in CLIP's), a final LayerNorm, one
    pooled token, a projection to the shared embedding."""

    vocab_size: int
    max_positions: int
    width: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    layer_norm_epsilon: float = 1e-6
    mlp_activation: str = "gelu"
    gelu_approximate: bool = True
    causal: bool = False
    pooling: str = "last"
    eos_token_id: Optional[int] = None
    projection_size: Optional[int] = None
    projection_bias: bool = True
    # LoRA's updates beside the blocks' projections ({"rank", "alpha", "targets"}, as ViTConfig.lora
    # gives them; None: none): an image-text run with --lora-rank adapts both towers alike.
    lora: Optional[dict] = None

    def __post_init__(self):
        if self.lora:
            rank, side = int(self.lora["rank"]), min(self.width, self.mlp_dim)
            if rank > side:
                raise UserError(f"lora rank {rank} does not fit the text tower's projections (width {self.width}): "
                                f"give a rank of at most {side}.")
        if self.pooling not in TEXT_POOLINGS:
            raise UserError(f"TextConfig.pooling={self.pooling!r}: choose one of {', '.join(TEXT_POOLINGS)}.")
        if self.pooling == "eos" and self.eos_token_id is None:
            raise UserError("TextConfig.pooling='eos' needs eos_token_id, the end-of-text token it reads.")
        if self.width % self.num_heads:
            raise UserError(f"TextConfig: width {self.width} is not divisible by num_heads {self.num_heads}.")

    @property
    def embedding_size(self) -> int:
        return self.projection_size or self.width

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TextConfig":
        return cls(**d)
