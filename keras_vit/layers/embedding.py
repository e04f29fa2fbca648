"""The layers before the blocks and after them: input scaling, patches, prefix tokens, token pooling.

`InputNormalization` maps the [-1, 1] input to a checkpoint's own pixel
statistics, `PatchEmbedding` cuts an image into patches and projects them,
`ClassToken` prepends the learned [class] token, `DistillationToken`
DeiT's distillation token and `RegisterTokens` the register tokens, and `TokenPooling` reduces the tokens to one vector for the
head. `dtype_policy` reads a model's `dtype=`.
"""

import keras
from keras import ops

from keras_vit.utils.shapes import as_pair

# The precisions a ViT runs in (`dtype=`): float32, half precision, or mixed (float32 weights).
PRECISIONS = ("float32", "bfloat16", "mixed_bfloat16", "float16", "mixed_float16")


@keras.saving.register_keras_serializable(package="keras_vit")
class InputNormalization(keras.layers.Layer):
    """Map images in [-1, 1] to the per-channel statistics a checkpoint was trained with.

    keras_vit models all take `preprocess_input`'s [-1, 1] images; weights
    trained on `(pixel / 255 - mean) / std` (ImageNet's statistics for DeiT
    and DINOv2, OpenAI's for CLIP) get this layer first, computing
    `((x + 1) / 2 - mean) / std`, so that every caller (the CLI, the data
    pipelines, an export) feeds them the same images. No weights.

    Example:
    >>> import numpy as np
    >>> layer = InputNormalization(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    >>> np.round(np.asarray(layer(np.full((1, 1, 1, 3), 1.0))), 3)  # white
    array([[[[2.249, 2.429, 2.64 ]]]], dtype=float32)
    """

    def __init__(self, mean, std, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.mean = tuple(float(value) for value in mean)
        self.std = tuple(float(value) for value in std)

    def call(self, images):  # ((x + 1) / 2 - mean) / std
        return self._affine(images, [0.5 / std for std in self.std],
                            [(0.5 - mean) / std for mean, std in zip(self.mean, self.std)])

    def undo(self, values):
        """`values` normalised as this layer normalises (transformers' `pixel_values`), back in [-1, 1]."""
        return self._affine(values, [2 * std for std in self.std], [2 * mean - 1 for mean in self.mean])

    def _affine(self, values, scale, shift):
        """`values * scale + shift`, per channel, in one multiply-add."""
        values = ops.cast(values, self.compute_dtype)
        # NaFlex patches flatten (row, column, channel): the statistics repeat once per pixel along the last axis.
        repeats = values.shape[-1] // len(self.mean)
        return values * ops.convert_to_tensor(scale * repeats, dtype=self.compute_dtype) + \
            ops.convert_to_tensor(shift * repeats, dtype=self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(mean=list(self.mean), std=list(self.std))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Split images into non-overlapping patches and project each to a vector.

    A `patch_size`-strided convolution with bias, as in the original model
    (`use_bias=False`: without, as CLIP's).
    Input `(batch, height, width, channels)` with height and width divisible
    by `patch_size` (with `drop_remainder=True` any size: the last rows and
    columns that fill no patch are left out, as timm's convolution does);
    output `(batch, (height // P) * (width // P), hidden_size)`
    in row-major patch order, or the grid `(batch, height // P, width // P,
    hidden_size)` with `flatten=False` (a dynamic-resolution model reads its
    grid from it).

    Example:
    >>> import numpy as np
    >>> PatchEmbedding(patch_size=16, hidden_size=32)(np.zeros((2, 64, 48, 3))).shape
    (2, 12, 32)
    """

    def __init__(
        self,
        patch_size,
        hidden_size,
        kernel_initializer="lecun_normal",
        bias_initializer="zeros",
        flatten=True,
        use_bias=True,
        drop_remainder=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # === Config ===
        self.patch_size = as_pair(patch_size, "patch_size")
        self.hidden_size = int(hidden_size)
        self.flatten = bool(flatten)
        self.use_bias = bool(use_bias)
        self.drop_remainder = bool(drop_remainder)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def grid_size(self, input_shape):
        """The `(rows, cols)` patch grid of an input shape; errors if not divisible (unless `drop_remainder`)."""
        height, width = input_shape[1], input_shape[2]
        for size, patch, axis in zip((height, width), self.patch_size, ("height", "width")):
            if size is not None and (size % patch if not self.drop_remainder else size < patch):
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the patch size {patch} "
                    f"(input shape {tuple(input_shape)})" + ("." if not self.drop_remainder else
                                                             ": it is smaller than one patch.")
                )
        return tuple(
            None if size is None else size // patch
            for size, patch in zip((height, width), self.patch_size)
        )

    @property
    def window(self):
        """The `(height, width)` of the kernel: the patch's (a subclass's may overlap its neighbours)."""
        return self.patch_size

    def pad(self, images):
        """The images the kernel slides over: as they are (a subclass's may pad them)."""
        return images

    def build(self, input_shape):
        self.grid_size(input_shape)
        channels = input_shape[-1]
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.window, channels, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        self.bias = self.add_weight(
            name="bias", shape=(self.hidden_size,), initializer=self.bias_initializer
        ) if self.use_bias else None

    def call(self, images):
        self.grid_size(images.shape)  # Unless drop_remainder, a "valid" convolution must not crop silently.
        patches = ops.conv(
            self.pad(images),
            self.kernel,
            strides=self.patch_size,
            padding="valid",
            data_format="channels_last",
        )
        if self.use_bias:
            patches = patches + self.bias
        if not self.flatten:
            return patches
        shape = ops.shape(patches)
        return ops.reshape(patches, (shape[0], shape[1] * shape[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        rows, cols = self.grid_size(input_shape)
        if not self.flatten:
            return (input_shape[0], rows, cols, self.hidden_size)
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, self.hidden_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            patch_size=self.patch_size,
            hidden_size=self.hidden_size,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        if not self.flatten:  # Kept out of fixed-size models' configs, which older keras_vit reads.
            config.update(flatten=False)
        if not self.use_bias:
            config.update(use_bias=False)
        if self.drop_remainder:
            config.update(drop_remainder=True)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepend a learned [class] token to a token sequence.

    Example:
    >>> import numpy as np
    >>> ClassToken()(np.zeros((2, 196, 32))).shape
    (2, 197, 32)
    """

    WEIGHT = "cls"  # the weight's name, and the attribute that holds it

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        setattr(self, self.WEIGHT, self.add_weight(name=self.WEIGHT, shape=(1, 1, input_shape[-1]),
                                                   initializer=self.initializer))

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        token = getattr(self, self.WEIGHT)
        token = ops.broadcast_to(ops.cast(token, tokens.dtype), (batch, 1, ops.shape(token)[-1]))
        return ops.concatenate([token, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(initializer=keras.initializers.serialize(self.initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class DistillationToken(ClassToken):
    """Prepend DeiT's learned distillation token (Touvron et al., 2021), weight `dist`.

    In a ViT it sits right after the class token, as timm places it: apply
    this layer first, then `ClassToken`.

    Example:
    >>> import numpy as np
    >>> DistillationToken()(np.zeros((2, 196, 32))).shape
    (2, 197, 32)
    """

    WEIGHT = "dist"


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """Prepend `count` learned register tokens (Darcet et al., 2023, "Vision Transformers Need Registers").

    In a ViT they sit between the class token and the patch tokens, as
    timm places them: apply this layer first, then `ClassToken`.

    Example:
    >>> import numpy as np
    >>> RegisterTokens(4)(np.zeros((2, 196, 32))).shape
    (2, 200, 32)
    """

    def __init__(self, count, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if isinstance(count, bool) or int(count) != count or count < 1:
            raise ValueError(f"RegisterTokens needs a count of at least 1, got {count!r}.")
        # === Config ===
        self.count = int(count)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.registers = self.add_weight(
            name="registers", shape=(1, self.count, input_shape[-1]), initializer=self.initializer
        )

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        registers = ops.broadcast_to(ops.cast(self.registers, tokens.dtype),
                                     (batch, self.count, ops.shape(self.registers)[-1]))
        return ops.concatenate([registers, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + self.count
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(count=self.count, initializer=keras.initializers.serialize(self.initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pool a token sequence to one vector: the class token, the distillation token or the patch mean.

    `method="token"` takes the first token, `method="distillation"` the
    second (DeiT's distillation token); `method="gap"` averages the
    tokens after the first `num_prefix_tokens` (class and register tokens),
    only those where `token_mask` (a NaFlex batch's, `(batch, tokens)`) is True.

    Example:
    >>> import numpy as np
    >>> TokenPooling("gap", num_prefix_tokens=0)(np.ones((2, 196, 32))).shape
    (2, 32)
    """

    METHODS = ("token", "gap", "distillation")

    def __init__(self, method, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if method not in self.METHODS:
            raise ValueError(f"Unknown pooling {method!r}; expected one of {self.METHODS}.")
        if method == "token" and num_prefix_tokens < 1:
            raise ValueError("Token pooling needs a class token (num_prefix_tokens >= 1).")
        if method == "distillation" and num_prefix_tokens < 2:
            raise ValueError("Distillation pooling needs a class and a distillation token (num_prefix_tokens >= 2).")
        # === Config ===
        self.method = method
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens, token_mask=None):
        if self.method in ("token", "distillation"):
            return tokens[:, int(self.method == "distillation")]
        tokens = tokens[:, self.num_prefix_tokens :]
        if token_mask is None:
            return ops.mean(tokens, axis=1)
        # A NaFlex batch: the mean of each image's own patches, the padding left out.
        keep = ops.cast(ops.expand_dims(token_mask[:, self.num_prefix_tokens :], -1), tokens.dtype)
        return ops.sum(tokens * keep, axis=1) / ops.maximum(ops.sum(keep, axis=1), 1.0)

    def compute_output_shape(self, tokens_shape, token_mask_shape=None):
        return (tokens_shape[0], tokens_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(method=self.method, num_prefix_tokens=self.num_prefix_tokens)
        return config


def dtype_policy(dtype):
    """`dtype` as a `keras.DTypePolicy` (None stays None: the global policy), or a clear error."""
    if dtype is None:
        return None
    if isinstance(dtype, keras.DTypePolicy):
        floating = ("float16", "bfloat16", "float32", "float64")
        if isinstance(dtype, keras.dtype_policies.QuantizedDTypePolicy) or dtype.compute_dtype not in floating \
                or dtype.variable_dtype not in floating:
            raise ValueError(f"dtype policy {dtype.name!r} is not a floating-point precision; build the model in "
                             f"one of {list(PRECISIONS)}, then call model.quantize('int8') for 8-bit weights.")
        return dtype
    if dtype not in PRECISIONS:
        raise ValueError(f"Unknown dtype {dtype!r}; choose among {list(PRECISIONS)} or pass a keras.DTypePolicy.")
    return keras.DTypePolicy(dtype)
