"""Seeing inside a ViT: predictions, attention maps and the paper's figures.

Computing is separate from plotting: the functions below return numpy arrays;
`plots` turns them into PNGs; `make_figures` does everything for one model.
Functions that take `images` take pixels in 0..255 (see `images`).

    from keras_vit import inspection
    tokens, probs = inspection.encoder_attention(model, images)   # probs (B, layers, heads, T, T)
    for batch in inspection.forward_batches(model, images): ...  # tokens, attention, logits: one pass
    rollout = inspection.attention_rollout(probs)                # (B, T, T)
    inspection.make_figures(model, images, "figures/")
"""

from keras_vit.utils.lazy import lazy_exports

_FROM = {
    "analysis": ("MeanAttentionDistance", "attention_distance", "cosine_similarity_grid", "embedding_filter_pca", "mean_attention_distance",
                 "patch_distances", "pca", "position_embedding_similarity", "uniform_attention_distance"),
    "attention": ("attention_rollout", "embed", "encoder_attention", "forward_batches", "head_maps", "num_prefix_tokens", "patch_map",
                  "rollout_maps"),
    "figures": ("make_figures",),
    "predict": ("Prediction", "find_labels", "load_model", "predict_files", "predict_probabilities",
                "read_labels_file"),
}
# Imported on first use (PEP 562): `keras-vit predict --help` starts no TensorFlow.
__getattr__, __dir__ = lazy_exports(__name__, {
    "plots": "keras_vit.inspection.plots",
    **{name: f"keras_vit.inspection.{module}" for module, names in _FROM.items() for name in names},
    # Image reading has one home for every path: keras_vit.images.
    **{name: "keras_vit.images" for name in ("find_images", "load_image", "load_images", "model_inputs",
                                             "to_model_pixels")},
})

__all__ = [
    "MeanAttentionDistance", "Prediction", "attention_distance", "attention_rollout", "cosine_similarity_grid",
    "embed", "embedding_filter_pca", "encoder_attention", "find_images", "find_labels", "forward_batches",
    "head_maps", "load_image", "load_images", "load_model", "make_figures", "mean_attention_distance",
    "model_inputs", "num_prefix_tokens", "patch_distances", "patch_map", "pca", "plots",
    "position_embedding_similarity", "predict_files", "predict_probabilities", "read_labels_file", "rollout_maps",
    "to_model_pixels", "uniform_attention_distance",
]
