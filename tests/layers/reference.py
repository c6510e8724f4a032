"""Plain-numpy forward passes written from the paper's equations, used as
independent references for the layers."""

import numpy as np


def layer_norm(x, gamma, beta, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def attention(x, wq, bq, wk, bk, wv, bv, wo, bo, logit_bias=None):
    """x (B, N, D); w* (D, H, K); b* (H, K); wo (H, K, D); bo (D,); logit_bias
    (H, N, N) added to the scaled logits before the softmax, or None.
    Returns (output (B, N, D), probabilities (B, H, N, N))."""
    q = np.einsum("bnd,dhk->bhnk", x, wq) + bq[None, :, None, :]
    k = np.einsum("bnd,dhk->bhnk", x, wk) + bk[None, :, None, :]
    v = np.einsum("bnd,dhk->bhnk", x, wv) + bv[None, :, None, :]
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if logit_bias is not None:
        logits = logits + logit_bias[None]
    probs = softmax(logits)
    context = probs @ v  # (B, H, N, K)
    return np.einsum("bhnk,hkd->bnd", context, wo) + bo, probs


def mlp(x, w0, b0, w1, b1):
    return gelu_tanh(x @ w0 + b0) @ w1 + b1


def encoder_block(x, p):
    """p: dict of the block's official-layout parameters."""
    y = layer_norm(x, p["ln0_scale"], p["ln0_bias"])
    y, _ = attention(y, *p["attention"])
    x = x + y
    y = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
    return x + mlp(y, *p["mlp"])


def vit_forward(params, images, config):
    """A whole non-hybrid ViT from official-layout params, in numpy."""
    p, d = config.patch_size, config.hidden_size
    b, h, w, c = images.shape
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    x = patches @ params["embedding/kernel"].reshape(-1, d) + params["embedding/bias"]
    if config.classifier == "token":
        x = np.concatenate([np.broadcast_to(params["cls"], (b, 1, d)), x], axis=1)
    x = x + params["Transformer/posembed_input/pos_embedding"]
    for i in range(config.num_layers):
        q = f"Transformer/encoderblock_{i}/"
        a = q + "MultiHeadDotProductAttention_1/"
        x = encoder_block(x, {
            "ln0_scale": params[q + "LayerNorm_0/scale"], "ln0_bias": params[q + "LayerNorm_0/bias"],
            "ln2_scale": params[q + "LayerNorm_2/scale"], "ln2_bias": params[q + "LayerNorm_2/bias"],
            "attention": [params[a + f"{n}/{v}"] for n in ("query", "key", "value", "out") for v in ("kernel", "bias")],
            "mlp": [params[q + f"MlpBlock_3/Dense_{j}/{v}"] for j in (0, 1) for v in ("kernel", "bias")],
        })
    x = layer_norm(x, params["Transformer/encoder_norm/scale"], params["Transformer/encoder_norm/bias"])
    x = x[:, 0] if config.classifier == "token" else x.mean(axis=1)
    if "pre_logits/kernel" in params:
        x = np.tanh(x @ params["pre_logits/kernel"] + params["pre_logits/bias"])
    if "head/kernel" in params:
        x = x @ params["head/kernel"] + params["head/bias"]
    return x
