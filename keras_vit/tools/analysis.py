"""Seeing inside a ViT: the paper's Section 4.5 / Figure 7 and its few-shot evaluation.

* `attention_weights` — every layer's attention probabilities, from the
  model's own layers (no retraining, any backend);
* `attention_rollout` / `rollout_map` / `overlay` — Abnar & Zuidema's rollout;
* `mean_attention_distance` — Figure 7 (right);
* `position_embedding_similarity` — Figure 7 (centre);
* `embedding_filters` — Figure 7 (left);
* `few_shot_linear_eval` / `extract_features` — closed-form regularised
  least squares to {-1, 1}^K targets on frozen features.

The `plot_*` functions write PNG files with matplotlib.
"""

import logging
import math
import os

import keras
import numpy as np

from keras_vit.data.imagenet import preprocess_input
from keras_vit.data.naflex import check_naflex_batch, patchify
from keras_vit.layers import AxisPositionEmbedding, TokenPooling
from keras_vit.layers.naflex import NAFLEX_INPUTS, NaFlexFactorizedPositionEmbedding
from keras_vit.model.description import architecture_of, is_naflex, sizes_of
from keras_vit.utils import files

logger = logging.getLogger("keras_vit")


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _position_layer(model):
    """The model's learned position table: one table, NaFlex's factorized pair, or Gemma 4's per-axis pair."""
    return next((layer for layer in model.layers if layer.name in ("position_embedding", "axis_position_embedding")),
                None)


def _has_position_table(model):
    return _position_layer(model) is not None


def _is_hybrid(model):
    return any(layer.name == "conv_root" for layer in model.layers)


def attention_weights(model, images):
    """Attention probabilities of every layer: a list of `(batch, heads, tokens, tokens)` arrays.

    Runs the model's own embedding layers and `TransformerBlock`s, asking each
    block for its weights, so the numbers are those the model computes. A
    NaFlex model takes its batch dict (`keras_vit.data.naflex_batch`): every
    key its padding holds gets zero attention, and `naflex_attentions` cuts
    each image's own tokens out.

    Example:
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)
    >>> [a.shape for a in attention_weights(model, np.zeros((1, 32, 32, 3)))]
    [(1, 2, 17, 17), (1, 2, 17, 17)]
    """
    if is_naflex(model):
        check_naflex_batch(images, model.get_layer("embedding").patch_sizes)
        x = {key: np.asarray(images[key]) for key in NAFLEX_INPUTS}
    else:
        x = keras.ops.convert_to_tensor(np.asarray(images, "float32"))
    names = {layer.name for layer in model.layers}
    # The model's own tokens as the first block receives them (prefix tokens, position embeddings, norm_pre), and
    # what each block is called with: RoPE's token positions, a NaFlex batch's mask of its valid tokens, a shared
    # relative position bias.
    first = model.get_layer("encoderblock_0").input
    first = first[0] if isinstance(first, (list, tuple)) else first
    given = {argument: model.get_layer(layer).output for argument, layer in
             (("rope_positions", "rotary_positions"), ("key_mask", "token_mask"),
              ("attention_bias", "relative_position_bias")) if layer in names}
    outputs = keras.Model(model.input, [first, *given.values()] if given else first)(x, training=False)
    x, options = (outputs[0], dict(zip(given, outputs[1:]))) if given else (outputs, {})
    attentions = []
    index = 0
    while f"encoderblock_{index}" in names:
        block = model.get_layer(f"encoderblock_{index}")
        x, weights = block(x, training=False, return_attention_weights=True, **options)
        weights = _numpy(weights).astype("float32")
        if getattr(block, "window_size", 0):
            weights = _windows_on_the_grid(weights, block.relative_position_grid, block.window_size)
        attentions.append(weights)
        index += 1
    return attentions


def _windows_on_the_grid(weights, grid, window):
    """A windowed block's (SAM's) weights `(batch * windows, heads, w*w, w*w)` as `(batch, heads, h*w, h*w)` over
    the grid's tokens: each token attends within its window; the weights on the padding are left out."""
    rows, cols = -(-grid[0] // window), -(-grid[1] // window)
    padded = np.arange(rows * window * cols * window).reshape(rows * window, cols * window)
    # The padded grid's token at each (window, position in the window), -1 where it is padding.
    token = np.where((padded // (cols * window) < grid[0]) & (padded % (cols * window) < grid[1]),
                     (padded // (cols * window)) * grid[1] + padded % (cols * window), -1)
    token = token.reshape(rows, window, cols, window).transpose(0, 2, 1, 3).reshape(rows * cols, window * window)
    batch = weights.shape[0] // (rows * cols)
    weights = weights.reshape(batch, rows * cols, *weights.shape[1:])
    full = np.zeros((batch, weights.shape[2], grid[0] * grid[1], grid[0] * grid[1]), "float32")
    for index, tokens in enumerate(token):
        real = tokens >= 0
        full[:, :, tokens[real][:, None], tokens[real][None, :]] = weights[:, index][:, :, real][:, :, :, real]
    return full


def naflex_attentions(attentions, patch_grid, num_prefix_tokens):
    """Each image's own attentions from a NaFlex batch's: a list (per image) of per-layer `(1, heads, t, t)` arrays.

    `t` is the image's prefix tokens plus its `rows * cols` patches, so
    `attention_rollout`, `rollout_map` and `mean_attention_distance` take
    them at the image's own grid.
    """
    grids = np.asarray(patch_grid).reshape(-1, 2).tolist()
    return [[np.asarray(layer)[index:index + 1, :, :count, :count] for layer in attentions]
            for index, count in enumerate(num_prefix_tokens + rows * cols for rows, cols in grids)]


def attention_rollout(attentions, head_fusion="mean", discard_ratio=0.0, residual=True):
    """Attention rollout (Abnar & Zuidema, 2020): `(batch, tokens, tokens)`.

    Each layer's heads are fused (`"mean"`, `"max"` or `"min"`), the weakest
    `discard_ratio` of each row's attentions dropped, the residual path added
    as `0.5 * A + 0.5 * I` (if `residual`), rows renormalised, and the layers
    multiplied from the first to the last: `R = A_L ... A_2 A_1`.
    """
    fusions = {"mean": np.mean, "max": np.max, "min": np.min}
    if head_fusion not in fusions:
        raise ValueError(f"Unknown head_fusion {head_fusion!r}; expected one of {sorted(fusions)}.")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}.")
    rollout = None
    for attention in attentions:
        fused = fusions[head_fusion](np.asarray(attention, "float64"), axis=1)
        if discard_ratio:
            cutoff = np.quantile(fused, discard_ratio, axis=-1, keepdims=True)
            fused = np.where(fused < cutoff, 0.0, fused)
        if residual:
            fused = 0.5 * fused + 0.5 * np.eye(fused.shape[-1])
        fused = fused / fused.sum(-1, keepdims=True)
        rollout = fused if rollout is None else fused @ rollout
    if rollout is None:
        raise ValueError("attention_rollout needs at least one layer of attentions.")
    return rollout


def rollout_map(rollout, grid_size, num_prefix_tokens=1):
    """The class token's row of a rollout as a `grid_size` map scaled to [0, 1]."""
    if num_prefix_tokens < 1:
        raise ValueError("A rollout map needs a class token (num_prefix_tokens >= 1).")
    weights = np.asarray(rollout)[:, 0, num_prefix_tokens:]
    if weights.shape[-1] != grid_size[0] * grid_size[1]:
        raise ValueError(f"A rollout over {weights.shape[-1]} patch tokens is no {tuple(grid_size)} grid; pass the "
                         "grid of the image the attentions came from.")
    maps = weights.reshape(-1, *grid_size)
    low = maps.min(axis=(1, 2), keepdims=True)
    span = maps.max(axis=(1, 2), keepdims=True) - low
    return (maps - low) / np.where(span > 0, span, 1.0)


def _as_pixels(image):
    """uint8 pixels of an image given as uint8 or as `preprocess_input`'s [-1, 1] floats."""
    image = np.asarray(image)
    return image if image.dtype == np.uint8 else np.clip((image + 1.0) * 127.5, 0, 255).astype(np.uint8)


def overlay(image, attention_map, strength=0.6):
    """Blend a `[0, 1]` attention map (upsampled) over an image; returns uint8 RGB.

    `image` is uint8 `(H, W, 3)` or float in [-1, 1]; the map brightens
    attended regions and darkens the rest.
    """
    image = _as_pixels(image)
    height, width = image.shape[:2]
    rows = (np.arange(height) * attention_map.shape[0] // height)
    cols = (np.arange(width) * attention_map.shape[1] // width)
    mask = attention_map[rows][:, cols][..., None]
    blended = image.astype("float32") * ((1.0 - strength) + strength * mask)
    return np.clip(blended, 0, 255).astype(np.uint8)


def _patch_centres(grid_size, patch_size):
    rows, cols = np.meshgrid(np.arange(grid_size[0]), np.arange(grid_size[1]), indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=-1).astype("float64") * patch_size


def mean_attention_distance(attentions, grid_size, patch_size, num_prefix_tokens=1):
    """Attention-weighted mean distance in pixels, `(layers, heads)` (paper Figure 7, right).

    For each query patch, the pixel distance to every key patch (between patch
    centres) is averaged with that query's attention weights over the patch
    keys (prefix tokens ignored, weights renormalised over the patches), then
    averaged over queries and the batch.

    Example:
    >>> uniform = [np.full((1, 1, 5, 5), 0.2)]
    >>> mean_attention_distance(uniform, (2, 2), 16, num_prefix_tokens=1).round(2)
    array([[13.66]])
    """
    grid_size = (grid_size, grid_size) if isinstance(grid_size, int) else tuple(grid_size)
    centres = _patch_centres(grid_size, patch_size)
    distances = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    patches = grid_size[0] * grid_size[1]
    result = []
    for attention in attentions:
        attention = np.asarray(attention, "float64")
        if attention.shape[-1] != num_prefix_tokens + patches:
            raise ValueError(
                f"Attention over {attention.shape[-1]} tokens does not match {num_prefix_tokens} prefix "
                f"tokens plus a {grid_size} grid."
            )
        weights = attention[..., num_prefix_tokens:, num_prefix_tokens:]
        weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-12)
        per_query = (weights * distances).sum(-1)  # (batch, heads, queries)
        result.append(per_query.mean(axis=(0, 2)))
    return np.stack(result)


def position_embedding_similarity(model):
    """Cosine similarity of each patch's position embedding with every other.

    Returns `(rows, cols, rows, cols)`: entry `[i, j]` is the similarity map of
    patch `(i, j)` against the grid, the grid of grids of Figure 7 (centre).
    """
    if not _has_position_table(model):
        raise ValueError(f"{model.name!r} has no learned position table (its positions are rotary, RoPE): there is "
                         "no position-embedding similarity to show.")
    position = _position_layer(model)
    grid_size = tuple(position.grid_size)  # The table's grid, not the sequence's
    prefix = getattr(position, "num_prefix_tokens", 0)
    if isinstance(position, (NaFlexFactorizedPositionEmbedding, AxisPositionEmbedding)):  # what two tables add
        width = (position.pos_embedding_rows if isinstance(position, NaFlexFactorizedPositionEmbedding)
                 else position.table).shape[-1]
        zeros = np.zeros((1, grid_size[0] * grid_size[1], width), "float32")
        added = position(zeros, np.array([grid_size], "int32")) if isinstance(
            position, NaFlexFactorizedPositionEmbedding) else position(zeros)
        table = _numpy(added)[0].astype("float64")
    else:
        table = _numpy(position.pos_embedding)[0, prefix:].astype("float64")
    unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-12)
    return (unit @ unit.T).reshape(*grid_size, *grid_size)


def embedding_filters(model, n=28):
    """The first `n` principal components of the patch-embedding filters, `(n, P, P, C)`.

    Each of the `hidden_size` filters is a `P x P x C` patch; their principal
    components (Figure 7, left) are returned scaled to [0, 1] for display.
    """
    kernel = _numpy(model.get_layer("embedding").kernel).astype("float64")  # (P, P, C, D)
    if _is_hybrid(model):
        raise ValueError("A hybrid's patch embedding filters see ResNet features, not pixels: there is no RGB "
                         "filter to show.")
    patch_shape = kernel.shape[:3]
    filters = kernel.reshape(-1, kernel.shape[-1]).T  # (D, P*P*C)
    centred = filters - filters.mean(0, keepdims=True)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    components = components[: min(n, components.shape[0])]
    low = components.min(1, keepdims=True)
    span = components.max(1, keepdims=True) - low
    scaled = (components - low) / np.where(span > 0, span, 1.0)
    return scaled.reshape(-1, *patch_shape)


def few_shot_linear_eval(train_features, train_labels, test_features, test_labels, l2_reg=1.0, num_classes=None):
    """Top-1 accuracy of the paper's few-shot linear probe, a float in [0, 1].

    Solves the regularised least-squares problem from the frozen features
    (plus a bias column) to {-1, 1}^K targets in closed form,
    `W = (X^T X + l2_reg I)^-1 X^T Y`, and classifies test features by the
    largest output.

    Example:
    >>> x = np.eye(4); y = np.arange(4)
    >>> few_shot_linear_eval(x, y, x, y, l2_reg=1e-3)
    1.0
    """
    x_train = np.asarray(train_features, "float64").reshape(len(train_features), -1)
    x_test = np.asarray(test_features, "float64").reshape(len(test_features), -1)
    y_train, y_test = np.asarray(train_labels).astype(int), np.asarray(test_labels).astype(int)
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError("Features and labels must have the same length.")
    num_classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    targets = -np.ones((len(y_train), num_classes))
    targets[np.arange(len(y_train)), y_train] = 1.0
    design = np.concatenate([x_train, np.ones((len(x_train), 1))], axis=1)
    gram = design.T @ design + l2_reg * np.eye(design.shape[1])
    weights = np.linalg.solve(gram, design.T @ targets)
    scores = np.concatenate([x_test, np.ones((len(x_test), 1))], axis=1) @ weights
    return float(np.mean(scores.argmax(-1) == y_test))


def feature_model(model):
    """A model giving the representation the paper probes: what the head reads.

    That is the input of the `head` layer: the pre-logits, else the pooled
    vector (class token, patch mean or attention pooling, then `fc_norm`
    where the model has it). A model without its top gives its pooled
    output as it is; one that returns the token sequence is pooled the way
    its head pools, which for attention pooling needs the pooling layer:
    build such a model with `include_top=False, pooling="map"`.
    """
    names = {layer.name for layer in model.layers}
    if "head" in names:
        return keras.Model(model.input, model.get_layer("head").input)
    if len(model.output_shape) == 3:
        architecture = architecture_of(model)
        if architecture.classifier == "map":
            raise ValueError(f"{model.name!r} returns its token sequence, without the attention pooling (MAP) its "
                             "head pools with; build it with include_top=False, pooling='map' for its features.")
        # A NaFlex model's padding is left out of the mean, as its own pooling leaves it out.
        mask = {"token_mask": model.get_layer("token_mask").output} if is_naflex(model) else {}
        pooled = TokenPooling(architecture.classifier, architecture.num_prefix_tokens)(model.output, **mask)
        return keras.Model(model.input, pooled)
    return model


def extract_features(model, dataset, max_batches=None):
    """Frozen features and labels, as numpy arrays, from a tf.data `(images, labels)` dataset (or NaFlex batches:
    `NaFlexEvaluationBatches`, one feature per image)."""
    features_of = feature_model(model)
    features, labels = [], []
    for index, (images, batch_labels) in enumerate(dataset):
        if max_batches is not None and index >= max_batches:
            break
        features.append(_numpy(features_of(keras.tree.map_structure(np.asarray, images), training=False)))
        batch_labels = np.asarray(batch_labels)
        labels.append(batch_labels.argmax(-1) if batch_labels.ndim == 2 else batch_labels)
    return np.concatenate(features), np.concatenate(labels)


# ---------------------------------------------------------------------------
# Plots (PNG files).
# ---------------------------------------------------------------------------


def _save(figure, path):
    with files.atomic_path(path) as temporary:  # Whole, or the old figure untouched.
        figure.savefig(temporary, dpi=100, format=os.path.splitext(path)[1][1:] or "png")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("The figures need matplotlib, which each backend's extra installs: pip install "
                          "'keras-vision-transformer[jax]' (or [torch], [tensorflow]), or pip install matplotlib.") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_mean_attention_distance(distances, path, title="Mean attention distance"):
    """Each head's mean attention distance against network depth (Figure 7, right)."""
    plt = _pyplot()
    distances = np.asarray(distances)
    figure, axis = plt.subplots(figsize=(5, 4))
    for head in range(distances.shape[1]):
        axis.scatter(np.arange(1, len(distances) + 1), distances[:, head], s=12, label=f"head {head + 1}")
    axis.set(xlabel="network depth (layer)", ylabel="mean attention distance (pixels)", title=title)
    axis.set_xticks(np.arange(1, len(distances) + 1))
    if distances.shape[1] <= 16:
        axis.legend(fontsize=6, ncol=2)
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def plot_position_embedding_similarity(similarity, path):
    """The grid of cosine-similarity maps (Figure 7, centre)."""
    plt = _pyplot()
    rows, cols = similarity.shape[:2]
    figure, axes = plt.subplots(rows, cols, figsize=(cols * 0.6 + 1, rows * 0.6 + 0.5), squeeze=False)
    for i in range(rows):
        for j in range(cols):
            axes[i, j].imshow(similarity[i, j], vmin=-1, vmax=1, cmap="viridis")
            axes[i, j].set_axis_off()
    figure.suptitle("Position embedding similarity")
    _save(figure, path)
    plt.close(figure)


def plot_embedding_filters(filters, path):
    """Principal components of the patch-embedding filters (Figure 7, left)."""
    plt = _pyplot()
    count = len(filters)
    cols = min(7, count)
    rows = math.ceil(count / cols)
    figure, axes = plt.subplots(rows, cols, figsize=(cols * 0.9, rows * 0.9 + 0.4), squeeze=False)
    for index, axis in enumerate(axes.ravel()):
        axis.set_axis_off()
        if index < count:
            image = filters[index]
            axis.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray")
    figure.suptitle("RGB embedding filters (principal components)")
    _save(figure, path)
    plt.close(figure)


def plot_attention_overlay(image, attention_map, path):
    """The image beside the class token's rollout attention over it."""
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(6, 3))
    left.imshow(_as_pixels(image)), left.set_title("image"), left.set_axis_off()
    right.imshow(overlay(image, attention_map)), right.set_title("attention rollout"), right.set_axis_off()
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def inspect(model, image, output_dir):
    """Write every figure for one model and one image (`[-1, 1]` or uint8) to `output_dir`.

    The maps are on the image's own patch grid (a dynamic-resolution or
    NaFlex model takes any size of whole patches); a model without a learned position table (RoPE) has no
    position-embedding figure, which is said.
    """

    os.makedirs(output_dir, exist_ok=True)
    image = np.asarray(image)
    model_input = preprocess_input(image) if image.dtype == np.uint8 else image
    patch_size = sizes_of(model).pixels_per_patch  # In pixels, also for a hybrid.
    if is_naflex(model):  # The image's patches at its own grid, a batch of one with no padding.
        patches, grid = patchify(np.asarray(model_input, "float32"), patch_size)
        model_input = {"patches": patches, "patch_grid": np.array(grid, "int32"),
                       "patch_mask": np.ones(len(patches), bool)}
    attentions = attention_weights(model, keras.tree.map_structure(lambda x: x[None], model_input))
    grid_size = (image.shape[0] // patch_size, image.shape[1] // patch_size)  # The image's, not the table's
    prefix = architecture_of(model).block_prefix_tokens  # none in the blocks of CaiT, whose class token enters later
    written = {}
    if architecture_of(model).class_token and prefix:  # Rollout follows the class token's row.
        heat = rollout_map(attention_rollout(attentions), grid_size, prefix)[0]
        written["attention_rollout"] = os.path.join(output_dir, "attention_rollout.png")
        plot_attention_overlay(image, heat, written["attention_rollout"])
    distances = mean_attention_distance(attentions, grid_size, patch_size, prefix)
    written["mean_attention_distance"] = os.path.join(output_dir, "mean_attention_distance.png")
    plot_mean_attention_distance(distances, written["mean_attention_distance"])
    if _has_position_table(model):
        written["position_embedding_similarity"] = os.path.join(output_dir, "position_embedding_similarity.png")
        plot_position_embedding_similarity(position_embedding_similarity(model),
                                           written["position_embedding_similarity"])
    else:
        positions = "relative (attention biases)" if architecture_of(model).on_one_grid else "rotary (RoPE)"
        logger.warning(f"No position-embedding similarity figure: the model's positions are {positions}, with no "
                       "learned table to compare.")
    if not _is_hybrid(model):  # A hybrid's filters see no pixels.
        written["embedding_filters"] = os.path.join(output_dir, "embedding_filters.png")
        plot_embedding_filters(embedding_filters(model), written["embedding_filters"])
    return written
