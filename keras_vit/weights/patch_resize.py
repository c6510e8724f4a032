"""Loading a checkpoint at another patch size: FlexiViT's pseudo-inverse
resize of the patch-embedding kernel (Beyer et al., 2023, "FlexiViT: One
Model for All Patch Sizes", Sec. 3.4).

A token is <x, w> + b for a p x p patch x and kernel w. Resizing the patch to
p' (x' = B x, with B the bilinear resize) and looking for the kernel w' that
gives the same token, <x, w> = <B x, w'> for every x, means B^T w' = w; the
least-squares solution is w' = pinv(B^T) w. Upsampling (p' > p): B^T has
full row rank, so the token is preserved exactly for every patch.
Downsampling (p' < p): it is preserved for the patches B can represent
(x = B^T y, in the row space of B; for 16 -> 8, patches constant on 2x2
blocks) and is the least-squares best otherwise. The bias is kept.

B is TensorFlow's bilinear resize (tf.image.resize, half-pixel centres, no
antialiasing), as a matrix from the package's one resize
(keras_vit.layers.interpolation) so the kernel math stays in numpy.
"""

from __future__ import annotations

import numpy as np

from keras_vit.errors import UserError
from keras_vit.layers.interpolation import interpolation_matrix

# Official-layout key of the patch-embedding kernel (keras_vit.weights.layout).
PATCH_KERNEL_KEY = "embedding/kernel"


def patch_resize_matrix(old: int, new: int) -> np.ndarray:
    """(new * new, old * old): B with B @ x.ravel() = the row-major p' x p' resize of a p x p patch."""
    one_axis = interpolation_matrix(old, new, "bilinear")  # (new, old), tf.image.resize's rule
    return np.kron(one_axis, one_axis)  # rows then columns, row-major


def resize_patch_kernel(kernel, new_size: int) -> np.ndarray:
    """A (p, p, C, D) patch-embedding kernel for p' x p' patches: pinv(B^T) w
    per input channel and output unit (the module docstring says what is kept)."""
    kernel = np.asarray(kernel)
    if kernel.ndim != 4 or kernel.shape[0] != kernel.shape[1]:
        raise UserError(f"A patch-embedding kernel has shape (p, p, channels, width), got {kernel.shape}.")
    old = kernel.shape[0]
    if new_size == old:
        return kernel
    flat = kernel.reshape(old * old, -1).astype(np.float64)  # (p*p, C*D)
    resize = patch_resize_matrix(old, int(new_size))  # (p'*p', p*p)
    resized = np.linalg.pinv(resize.T) @ flat  # (p'*p', C*D)
    return resized.reshape(new_size, new_size, *kernel.shape[2:]).astype(kernel.dtype)


def resize_patch_params(params, shapes):
    """The checkpoint's patch kernel resized when the model's patch size differs
    (same channels and width). Returns (params, [what was resized, for the log])."""
    have, want = params.get(PATCH_KERNEL_KEY), shapes.get(PATCH_KERNEL_KEY)
    if have is None or want is None or tuple(have.shape) == tuple(want) or have.ndim != 4:
        return params, []
    if tuple(have.shape[2:]) != tuple(want[2:]) or want[0] != want[1]:
        return params, []  # another architecture: the loader's shape check names it
    params = dict(params)
    params[PATCH_KERNEL_KEY] = resize_patch_kernel(have, want[0])
    return params, [f"the patch kernel from {have.shape[0]}x{have.shape[1]} to {want[0]}x{want[1]} "
                    f"(FlexiViT pseudo-inverse resize)"]
