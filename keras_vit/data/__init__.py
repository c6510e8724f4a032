"""Data shipped inside the package: 5,000 MNIST digits (mnist5k.npz, read by
mnist5k), for `keras-vit demo`, the trainer's `mnist5k` dataset and export checks."""
