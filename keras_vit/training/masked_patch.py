"""Masked patch prediction, the paper's self-supervised objective (Section 4.6, Appendix B.1.2).

Half of the patch embeddings are corrupted (`PatchCorruption`): 80% of those
become a learned [mask] embedding, 10% a random other patch's embedding and
10% stay as they are. A 512-way head then predicts the 3-bit mean colour
(`mean_colour_bins`) of every corrupted patch from its output token.
`MaskedPatchPretrainer` wraps a keras_vit encoder with both and trains it
with plain `fit` on images alone; its `encoder` is then fine-tuned as usual.
"""

import keras
from keras import ops

from keras_vit.model.description import architecture_of, is_naflex, native_grid
from keras_vit.utils.shapes import as_pair
from keras_vit.utils.keras_internals import per_replica_loss


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """Corrupt a fixed share of patch embeddings, BERT style.

    Per image exactly `corruption_rate * num_patches` patches, rounded half
    up and at least one, are selected at random. Each selected patch becomes the
    learned mask embedding with probability `mask_rate`, the embedding of a
    random *other* patch of the batch (never its own) with probability
    `random_rate`, and stays unchanged otherwise. The corruption runs at
    every call, in training and at evaluation alike: the objective is
    measured on corrupted inputs.

    Call on `(batch, num_patches, hidden)` embeddings; returns the corrupted
    embeddings and a float32 `(batch, num_patches)` mask, 1 where selected.

    Example:
    >>> import numpy as np
    >>> tokens, selected = PatchCorruption(seed=0)(np.zeros((2, 16, 8)))
    >>> tuple(tokens.shape), float(keras.ops.sum(selected))
    ((2, 16, 8), 16.0)
    """

    def __init__(self, corruption_rate=0.5, mask_rate=0.8, random_rate=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.corruption_rate = float(corruption_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.seed = seed
        if not 0.0 < self.corruption_rate <= 1.0:
            raise ValueError(f"corruption_rate must be in (0, 1], got {self.corruption_rate}.")
        if self.mask_rate < 0.0 or self.random_rate < 0.0 or self.mask_rate + self.random_rate > 1.0:
            raise ValueError(
                "mask_rate and random_rate must be non-negative with a sum of at most 1, got "
                f"mask_rate={self.mask_rate} and random_rate={self.random_rate}."
            )
        self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        self.mask_embedding = self.add_weight(
            name="mask_embedding",
            shape=(input_shape[-1],),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def num_selected(self, num_patches):
        """How many of `num_patches` patches are corrupted per image."""
        return max(1, int(self.corruption_rate * num_patches + 0.5))

    def call(self, tokens):
        num_patches = tokens.shape[1]
        if num_patches is None:
            raise ValueError("PatchCorruption needs a static number of patches.")
        batch = ops.shape(tokens)[0]
        total = batch * num_patches

        # Rank uniform noise per image: the lowest ranks are the selected patches.
        noise = keras.random.uniform((batch, num_patches), seed=self.seed_generator)
        ranks = ops.argsort(ops.argsort(noise, axis=-1), axis=-1)
        selected = ranks < self.num_selected(num_patches)

        action = keras.random.uniform((batch, num_patches), seed=self.seed_generator)
        use_mask = selected & (action < self.mask_rate)
        use_random = selected & (action >= self.mask_rate) & (action < self.mask_rate + self.random_rate)

        # A flat index in [0, total - 1) shifted past the patch's own index: any other patch.
        draw = keras.random.uniform((batch, num_patches), seed=self.seed_generator)
        other = ops.cast(ops.floor(draw * ops.cast(total - 1, draw.dtype)), "int32")
        other = ops.minimum(other, total - 2)
        own = ops.reshape(ops.arange(total, dtype="int32"), (batch, num_patches))
        other = ops.clip(other + ops.cast(other >= own, "int32"), 0, total - 1)
        flat = ops.reshape(tokens, (total, ops.shape(tokens)[-1]))
        replacement = ops.reshape(ops.take(flat, ops.reshape(other, (-1,)), axis=0), ops.shape(tokens))

        mask_embedding = ops.cast(self.mask_embedding, tokens.dtype)
        corrupted = ops.where(use_random[..., None], replacement, tokens)
        corrupted = ops.where(use_mask[..., None], mask_embedding, corrupted)
        return corrupted, ops.cast(selected, "float32")

    def compute_output_spec(self, tokens):
        return (
            keras.KerasTensor(tokens.shape, tokens.dtype),
            keras.KerasTensor(tokens.shape[:2], "float32"),
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            corruption_rate=self.corruption_rate,
            mask_rate=self.mask_rate,
            random_rate=self.random_rate,
            seed=self.seed,
        )
        return config


def mean_colour_bins(images, patch_size, bits=3):
    """The quantised mean colour of every patch, as one class index per patch.

    `images` are `(batch, height, width, 3)` in [-1, 1]. Each patch's channel
    means are mapped to [0, 1] and cut into `2**bits` levels
    (`min(floor(mean * 2**bits), 2**bits - 1)`); the class is
    `r * 4**bits + g * 2**bits + b`. Returns int32 `(batch, rows * cols)` in
    row-major patch order, the order of `PatchEmbedding`'s tokens.

    Example:
    >>> import numpy as np
    >>> keras.ops.convert_to_numpy(mean_colour_bins(np.ones((1, 32, 32, 3)), patch_size=16))  # white
    array([[511, 511, 511, 511]], dtype=int32)
    """
    patch_height, patch_width = as_pair(patch_size, "patch_size")
    height, width = images.shape[1], images.shape[2]
    if images.shape[-1] != 3:
        raise ValueError(f"mean_colour_bins needs RGB images, got shape {tuple(images.shape)}.")
    if height % patch_height or width % patch_width:
        raise ValueError(
            f"Image size {(height, width)} is not divisible by the patch size {(patch_height, patch_width)}."
        )
    rows, cols = height // patch_height, width // patch_width
    levels = 2**bits
    images = ops.cast(images, "float32")
    patches = ops.reshape(images, (-1, rows, patch_height, cols, patch_width, images.shape[-1]))
    means = (ops.mean(patches, axis=(2, 4)) + 1.0) / 2.0
    level = ops.clip(ops.cast(ops.floor(means * levels), "int32"), 0, levels - 1)
    classes = level[..., 0] * levels * levels + level[..., 1] * levels + level[..., 2]
    return ops.reshape(classes, (-1, rows * cols))


@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchPretrainer(keras.Model):
    """Masked patch prediction around a keras_vit encoder.

    `encoder` is a keras_vit ViT that outputs its token sequence
    (`include_top=False`, `pooling=None`). Its graph runs as it is, with a
    `PatchCorruption` right after the patch embedding (the layer named
    `"embedding"`, so corrupted tokens get position embeddings too), then a
    Dense `colour_head` gives `2**(3 * bits)` logits per patch token. The
    layers are shared: fitting the pretrainer trains `encoder`.

    The loss is the cross-entropy of the patches' `mean_colour_bins`,
    averaged over the corrupted patches only, plus any regularisation
    losses; `corrupted_accuracy` is the accuracy on the same patches. The
    targets come from the images, so `fit` takes images alone (labels and
    sample weights, if given, are ignored) and `compile` needs only an
    optimizer. Calling the model returns `{"logits", "corrupted_mask"}`; it
    corrupts at evaluation as well as in training.

    Example:
    >>> import keras_vit
    >>> encoder = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=1,
    ...                         num_heads=2, mlp_dim=64, include_top=False)
    >>> pretrainer = MaskedPatchPretrainer(encoder)
    >>> pretrainer.compile(optimizer="adam")
    >>> images = keras.random.uniform((4, 32, 32, 3), -1.0, 1.0)
    >>> history = pretrainer.fit(images, epochs=1, batch_size=2, verbose=0)
    >>> tuple(pretrainer(images)["logits"].shape)
    (4, 16, 512)
    """

    def __init__(
        self,
        encoder,
        corruption_rate=0.5,
        mask_rate=0.8,
        random_rate=0.1,
        bits=3,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        names = {layer.name for layer in getattr(encoder, "layers", ())}
        if not isinstance(encoder, keras.Model) or "embedding" not in names or not any(
                name.startswith("encoderblock_") for name in names):
            raise ValueError(
                "encoder must be a keras_vit ViT model with layers named 'embedding' and 'encoderblock_0', ...; "
                f"{getattr(encoder, 'name', encoder)!r} is not one."
            )
        if is_naflex(encoder):
            raise ValueError(f"{encoder.name!r} is a NaFlex model, whose patches come cut, and masked-patch "
                             "prediction corrupts the patches of whole images: pretrain the image model of the same "
                             "sizes (keras_vit.ViT without naflex=True), whose weights a NaFlex model runs unchanged.")
        output_shape = encoder.output_shape
        if not isinstance(output_shape, tuple) or len(output_shape) != 3:
            raise ValueError(
                f"encoder must output its token sequence (include_top=False, pooling=None), "
                f"but its output shape is {output_shape}."
            )
        if architecture_of(encoder).soft_token_pool:
            raise ValueError(f"{encoder.name!r} gives Gemma 4's soft tokens, pooled from the patches, and masked-patch "
                             "prediction reads each patch's token: pretrain the tower without its pooling "
                             "(soft_token_pool=0), whose weights are the same, then build it with the pooling.")
        if int(bits) < 1:
            raise ValueError(f"bits must be at least 1, got {bits}.")
        # === Config ===
        self.encoder = encoder
        self.corruption_rate = float(corruption_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.bits = int(bits)
        self.seed = seed

        self.num_prefix_tokens = architecture_of(encoder).num_prefix_tokens
        self.grid_size = native_grid(encoder)  # a BEiT's or a RoPE ViT's too, which have no position table
        height, width = encoder.input_shape[1:3]
        self.patch_size = (height // self.grid_size[0], width // self.grid_size[1])

        # The encoder's own graph, cut at the patch embedding: the corruption goes between the two halves, and
        # whatever the encoder does after it (registers, norm_pre, ...) runs exactly as in the encoder.
        # Held outside Keras' tracking: the halves share the encoder's weights, which it already saves.
        embedding = encoder.get_layer("embedding").output
        halves = (keras.Model(encoder.input, embedding), keras.Model(embedding, encoder.output))
        object.__setattr__(self, "_encoder_halves", halves)
        self.corruption = PatchCorruption(
            corruption_rate, mask_rate, random_rate, seed=seed, dtype=self.dtype_policy, name="patch_corruption"
        )
        self.colour_head = keras.layers.Dense(2 ** (3 * self.bits), dtype=self.dtype_policy, name="colour_head")
        self.corrupted_accuracy = keras.metrics.SparseCategoricalAccuracy(name="corrupted_accuracy")
        self.build(encoder.input_shape)

    def build(self, input_shape):
        hidden_size = self.encoder.output_shape[-1]
        num_patches = self.grid_size[0] * self.grid_size[1]
        for layer in (self.corruption, self.colour_head):
            if not layer.built:
                layer.build((None, num_patches, hidden_size))
        self.built = True

    def call(self, images, training=None):
        # `training` is in the signature so that Keras hands it on to the encoder's dropout.
        patch_tokens, corrupted_mask = self.corruption(self._embed_patches(images))
        tokens = self._encode_patch_tokens(patch_tokens)
        logits = self.colour_head(tokens[:, self.num_prefix_tokens :])
        return {"logits": logits, "corrupted_mask": corrupted_mask}

    def _embed_patches(self, images):
        return self._encoder_halves[0](images)

    def _encode_patch_tokens(self, patch_tokens):
        return self._encoder_halves[1](patch_tokens)

    def colour_targets(self, images):
        """The `mean_colour_bins` classes of the images' patches."""
        return mean_colour_bins(images, self.patch_size, self.bits)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        targets = self.colour_targets(x)
        logits = ops.cast(y_pred["logits"], "float32")
        mask = ops.cast(y_pred["corrupted_mask"], "float32")
        cross_entropy = ops.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        loss = ops.sum(cross_entropy * mask) / ops.maximum(ops.sum(mask), 1.0)
        for extra in self.losses:
            loss = loss + ops.sum(ops.cast(extra, "float32"))
        return per_replica_loss(loss)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        self.corrupted_accuracy.update_state(
            self.colour_targets(x), ops.cast(y_pred["logits"], "float32"), sample_weight=y_pred["corrupted_mask"]
        )
        return self.get_metrics_result()

    def get_config(self):
        config = super().get_config()
        config.update(
            encoder=keras.saving.serialize_keras_object(self.encoder),
            corruption_rate=self.corruption_rate,
            mask_rate=self.mask_rate,
            random_rate=self.random_rate,
            bits=self.bits,
            seed=self.seed,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)
