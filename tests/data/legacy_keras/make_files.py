"""Writes small .keras files with keras_vit as of main before the ViT family (#31),
and each one's outputs on fixed inputs: tests/test_legacy_keras.py loads them."""
import numpy as np, keras, keras_vit, sys
out = sys.argv[1]
rng = np.random.default_rng(0)
base = dict(patch_size=4, hidden_size=32, mlp_dim=48, num_heads=4, num_layers=2)
cases = {
    "token_repr": (keras_vit.ViTConfig(**base, representation_size=16), dict(num_classes=5)),
    "gap_features": (keras_vit.ViTConfig(**base, classifier="gap"), dict(include_top=False)),
    "relative": (keras_vit.ViTConfig(**base, position_embedding="relative"), dict(num_classes=3, classifier_activation="softmax")),
    "dynamic_pixels": (keras_vit.ViTConfig(**base, layer_norm_epsilon=1e-12, gelu_approximate=False), dict(num_classes=4, dynamic_image_size=True, include_preprocessing=True)),
    "hybrid": (keras_vit.ViTConfig(patch_size=1, hidden_size=32, mlp_dim=48, num_heads=4, num_layers=1, resnet=dict(num_layers=(1,), width_factor=1)), dict(num_classes=2)),
}
images = {}
for name, (config, kwargs) in cases.items():
    size = 32 if name == "hybrid" else 16
    model = keras_vit.ViT(config, image_size=size, **kwargs)
    weights = [w + rng.normal(size=w.shape).astype("float32") * 0.5 for w in model.get_weights()]
    model.set_weights(weights)
    x = rng.uniform(0, 255, size=(2, size, size, 3)).astype("float32") if kwargs.get("include_preprocessing") else rng.uniform(-1, 1, size=(2, size, size, 3)).astype("float32")
    model.save(f"{out}/{name}.keras")
    images[name] = x
    images[name + "/out"] = np.asarray(model(x))
np.savez(f"{out}/expected.npz", **images)
print("ok", keras_vit.__version__ if hasattr(keras_vit, "__version__") else "")
