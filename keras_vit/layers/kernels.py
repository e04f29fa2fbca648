"""The speed kernels: attention and LayerNorm with written-out gradients, and the switches that choose them.

The layers in `keras_vit.layers` compute the paper's functions; this module
decides how some of them are differentiated on each platform, and nothing
else. Every function here equals its plain `keras.ops` counterpart (up to
float32 rounding), so switching paths changes no result:

- `attention` is the one entry point for multi-head attention. On CPUs
  under JAX and TensorFlow (`use_custom_gradients`) it runs
  `softmax_attention`, whose backward pass is written out; elsewhere it
  calls `keras.ops.dot_product_attention`, which has fused kernels on GPUs
  and TPUs, with `use_flash_attention` guarding the TPU; on PyTorch it
  calls torch's `scaled_dot_product_attention` on strided views.
- `layer_norm` is `LayerNorm`'s function under JAX and TensorFlow on CPUs
  (`use_matrix_means`): its means are matrix products and, where
  `use_custom_gradients`, its gradient is written out. On GPUs and TPUs,
  whose default float32 matrix products are TF32 or one bfloat16 pass,
  `LayerNorm` is Keras' own.
- `linear` is a `Dense` layer's product and bias: on PyTorch (`use_torch_kernels`) one
  `torch.nn.functional.linear` call, whose bias is added inside the product (`addmm`), not in a second pass.
- `torch_layer_norm` is `LayerNorm`'s function on PyTorch: torch's
  `layer_norm` on the tokens in their own dtype, without Keras' casts of a
  bfloat16 input to float32 and back.
- `float32_matmuls` makes a float32 model's products float32 on GPUs under
  JAX, whose default is TF32 there (PyTorch's is float32).
- `gelu` is the MLP's activation; on TensorFlow its exact form is written
  with `erf`, which the ONNX and LiteRT converters know.
- `set_custom_gradients(False)` turns the written-out gradients off, for
  forward-mode differentiation, which they do not support.
- `torch_adamw` and `torch_lamb` are `training.optimizers.LayerDecayAdamW`'s and `LayerDecayLamb`'s updates on
  PyTorch: torch's `_foreach_` ops over each param group, where Keras runs one variable and op at a time.

benchmarks/README.md records what each of these was measured against.
"""

import contextlib
import logging
import math

import keras
from keras import ops

from keras_vit.utils.keras_internals import flash_attention_refusal

logger = logging.getLogger("keras_vit")


def _platform():
    """Where the backend runs the model: "cpu", "gpu" or "tpu" (Keras' own device list)."""
    return keras.distribution.list_devices()[0].split(":")[0].lower()


def use_flash_attention():
    """The `flash_attention` argument for `keras.ops.dot_product_attention`.

    Keras' JAX backend routes TPU attention with no mask through the Splash
    kernel, which then applies a *causal* mask. ViT attention is
    bidirectional, so on TPU we turn the flash path off (XLA's fused
    attention is used instead); elsewhere Keras chooses (`None`).
    """
    if keras.backend.backend() != "jax":
        return None
    return False if _platform() == "tpu" else None


_custom_gradients_enabled = True


def set_custom_gradients(enabled):
    """Allow or forbid keras_vit's written-out gradients; returns the previous setting.

    Where `use_custom_gradients` says so, `layer_norm` and `attention`
    (through `softmax_attention`) use gradients written out with
    `keras.ops.custom_gradient`. The functions are the same either way, but a
    custom gradient does not support forward-mode differentiation (`jax.jvp`,
    `jax.jacfwd`, forward-over-reverse Hessian products): turn them off for
    that. Applies when a model's function is next traced (a new model, or a
    new `compile`).

    Example:
    >>> previous = set_custom_gradients(False)
    >>> use_custom_gradients()
    False
    >>> set_custom_gradients(previous)
    False
    """
    global _custom_gradients_enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"set_custom_gradients takes True or False, got {enabled!r}.")
    previous, _custom_gradients_enabled = _custom_gradients_enabled, enabled
    return previous


def float32_matmuls(compute_dtype):
    """A context in which a float32 model's matrix products are float32 on a GPU under JAX.

    XLA's default precision for float32 products on recent NVIDIA GPUs is
    TF32 (10 mantissa bits), which puts a ViT-B/16's float32 logits about
    1e-3 off timm's; PyTorch computes them in float32. A model in the
    float32 policy therefore traces its call under
    `jax.default_matmul_precision("float32")` there, unless the user set
    `jax_default_matmul_precision` (that setting is kept). Bfloat16 policies
    are untouched, and so are CPUs (float32 already) and TPUs, whose default
    is one bfloat16 pass: set `jax_default_matmul_precision="float32"` for
    float32 products there.

    Example:
    >>> with float32_matmuls("float32"):
    ...     pass
    """
    if compute_dtype != "float32" or keras.backend.backend() != "jax" or _platform() != "gpu":
        return contextlib.nullcontext()
    import jax  # Only on the JAX backend, which has jax.

    if jax.config.jax_default_matmul_precision is not None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision("float32")


_flash_attention_refusals_logged = set()


def _flash_attention(query, key, value):
    """`flash_attention` for Keras' `dot_product_attention` on a JAX GPU: True where cuDNN's fused kernel takes
    the inputs, else False, with the reason logged once (Keras would fall back to XLA's attention silently)."""
    if keras.backend.standardize_dtype(query.dtype) not in ("bfloat16", "float16"):
        reason = f"cuDNN's fused attention takes bfloat16 or float16, not {keras.backend.standardize_dtype(query.dtype)}"
    else:
        reason = flash_attention_refusal(query, key, value)
    if reason is None:
        return True
    if reason not in _flash_attention_refusals_logged:
        _flash_attention_refusals_logged.add(reason)
        logger.warning("keras_vit: attention runs XLA's kernel, not cuDNN's fused one (%s).", reason)
    return False


def use_custom_gradients():
    """Whether `attention` and `layer_norm` use their written-out gradients now.

    Yes on CPUs under JAX and TensorFlow, unless `set_custom_gradients(False)`.
    There Keras' `dot_product_attention` is a plain XLA graph with no fused
    kernel behind it, and XLA's CPU backend runs the column reductions of a
    differentiated softmax and LayerNorm slowly (see benchmarks/README.md).
    On GPUs and TPUs Keras may use flash kernels, and on PyTorch it calls
    torch's fused `scaled_dot_product_attention` and `layer_norm`
    everywhere, so those keep Keras' ops.
    """
    if not _custom_gradients_enabled:
        return False
    return keras.backend.backend() in ("jax", "tensorflow") and _platform() == "cpu"


def use_matrix_means():
    """Whether `LayerNorm` computes its means as matrix products (`layer_norm`): on CPUs under JAX and TensorFlow.

    That is where it was measured faster (benchmarks/README.md). On a TPU a
    float32 matrix product is by default one bfloat16 pass and on recent
    GPUs TF32, which would round every LayerNorm's mean and variance to 8 or
    10 bits; there Keras' elementwise normalisation keeps float32.
    """
    return keras.backend.backend() in ("jax", "tensorflow") and _platform() == "cpu"


def use_torch_kernels():
    """Whether `linear` and `attention` call torch's fused functions themselves: on the PyTorch backend.

    Keras runs eagerly there, one torch op per `keras.ops` call. Its `Dense`
    computes `ops.matmul`, then `ops.add` for the bias, a second pass over
    every projection's output, where torch's `linear` adds the bias inside
    the product; its `dot_product_attention` copies the transposed queries,
    keys and values into contiguous arrays before torch's
    `scaled_dot_product_attention`, which takes the strided views as they
    are. Keras' LayerNorm already is torch's `layer_norm`
    (benchmarks/README.md).
    """
    return keras.backend.backend() == "torch"


_FUSED_LINEAR_DTYPES = ("float32", "bfloat16")


def linear(inputs, kernel, bias=None):
    """`inputs @ kernel + bias` for a `(..., in)` input and an `(in, out)` kernel, as Keras' `Dense` computes it.

    On PyTorch, for float32 or bfloat16 inputs and weights of one dtype, it
    is torch's `linear` with the bias fused into the product (equal to
    float32 rounding); otherwise, and on JAX and TensorFlow, whose compilers
    fuse the addition themselves, `keras.ops.matmul` then `keras.ops.add`.

    Example:
    >>> import numpy as np
    >>> x, kernel, bias = np.ones((2, 3), "float32"), np.ones((3, 4), "float32"), np.arange(4.0, dtype="float32")
    >>> np.asarray(linear(x, kernel, bias)).tolist()
    [[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]]
    """
    if use_torch_kernels():
        inputs, kernel = ops.convert_to_tensor(inputs), ops.convert_to_tensor(kernel)
        bias = None if bias is None else ops.convert_to_tensor(bias)
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if dtype in _FUSED_LINEAR_DTYPES and all(keras.backend.standardize_dtype(t.dtype) == dtype
                                                 for t in (kernel, bias) if t is not None):
            from torch.nn import functional  # Only on the PyTorch backend, which has torch.

            return functional.linear(inputs, kernel.T, bias)  # kernel.T is a view: addmm(bias, inputs, kernel)
    outputs = ops.matmul(inputs, kernel)
    return outputs if bias is None else ops.add(outputs, bias)


MASKED_LOGIT = -1e30  # A masked key's logit: exp(MASKED_LOGIT - max) is exactly 0 in float32, and never NaN.


def key_mask_bias(key_mask):
    """`(batch, 1, 1, keys)` float32 logit offsets from a `(batch, keys)` mask: 0 where True, `MASKED_LOGIT` where False."""
    keep = ops.cast(key_mask, "bool")[:, None, None, :]
    return ops.where(keep, 0.0, MASKED_LOGIT)


def attention(query, key, value, key_mask=None, bias=None):
    """Bidirectional scaled dot-product attention on `(batch, tokens, heads, head_dim)` inputs.

    `softmax(q k^T / sqrt(head_dim)) v` with the softmax in float32, through
    `softmax_attention` where `use_custom_gradients()`, on PyTorch through
    torch's `scaled_dot_product_attention` (the kernel Keras calls there,
    without its copies), otherwise through `keras.ops.dot_product_attention`
    with `flash_attention=use_flash_attention()` (on a GPU under JAX: cuDNN's
    fused kernel where it takes the inputs, else XLA's, said once in the
    log). `key_mask`, `(batch,
    keys)` booleans, leaves out the keys where it is False (NaFlex padding):
    their weights are exactly zero, so no query depends on what they hold.
    `bias`, `(1 or batch, heads, queries, keys)`, is added to the logits
    before the softmax (BEiT's relative position bias), and learns.

    Example:
    >>> import numpy as np
    >>> q = np.random.default_rng(0).normal(size=(2, 5, 3, 4)).astype("float32")
    >>> tuple(attention(q, q, q).shape)
    (2, 5, 3, 4)
    >>> mask = np.array([[True] * 5, [True, True, False, False, False]])
    >>> bool(np.allclose(attention(q, q, q, mask)[1, :2], attention(q[1:, :2], q[1:, :2], q[1:, :2])[0], atol=1e-6))
    True
    """
    if use_custom_gradients():
        return softmax_attention(query, key, value, key_mask, bias)
    if bias is not None:  # one additive mask: the bias, and the padding's -inf where there is a key mask
        bias = ops.cast(bias, "float32") if key_mask is None else ops.cast(bias, "float32") + key_mask_bias(key_mask)
        bias, key_mask = ops.cast(bias, query.dtype), None
    if use_torch_kernels() and query.dtype == key.dtype == value.dtype:
        from torch.nn import functional  # Only on the PyTorch backend, which has torch.

        mask = None if key_mask is None else ops.convert_to_tensor(key_mask).bool()[:, None, None, :]
        mask = ops.convert_to_tensor(bias) if bias is not None else mask
        query, key, value = (ops.convert_to_tensor(t).transpose(1, 2) for t in (query, key, value))
        return functional.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)
    mask = None if key_mask is None else ops.cast(key_mask, "bool")[:, None, None, :]
    flash = use_flash_attention() if mask is None and bias is None else False
    if flash is None and keras.backend.backend() == "jax" and _platform() == "gpu":
        flash = _flash_attention(query, key, value)
    return ops.dot_product_attention(query, key, value, bias=bias, mask=mask, flash_attention=flash)


def softmax_attention(query, key, value, key_mask=None, bias=None):
    """Bidirectional scaled dot-product attention with a FlashAttention-style backward pass.

    Computes `softmax(q k^T / sqrt(head_dim)) v` on `(batch, tokens, heads,
    head_dim)` inputs, the same function as `keras.ops.dot_product_attention`
    (softmax in float32), in `keras.ops` only. Two things make it cheaper
    than differentiating the softmax graph:

    - the sums are applied after the product with `v`, to a `(tokens,
      head_dim)` array instead of the `(tokens, tokens)` weights;
    - the backward pass forms the softmax correction
      `sum_s dW[t, s] W[t, s]` as `sum_h dO[t, h] O[t, h]` (the identity
      FlashAttention uses), a reduction over the small output instead of the
      attention matrix, and no gradient flows through the max shift.

    `key_mask` and `bias` are `attention`'s; the bias's gradient is the
    logits', summed over the axes it broadcasts along.

    Example:
    >>> import numpy as np
    >>> q = np.random.default_rng(0).normal(size=(2, 5, 3, 4)).astype("float32")
    >>> tuple(softmax_attention(q, q, q).shape)
    (2, 5, 3, 4)
    """
    scale = 1.0 / math.sqrt(query.shape[-1])
    # A mask goes in as an input (with a zero gradient), not a closure: JAX's custom gradients take no tracers
    # from outside. Without one there is no bias to add at all.
    masks = () if key_mask is None else (key_mask_bias(key_mask),)
    learned = () if bias is None else (ops.cast(bias, "float32"),)

    @ops.custom_gradient
    def attend(query, key, value, *extra):
        # Heads first, so that every product is a plain batched matmul. The logits and their
        # gradients are float32 whatever the inputs (as Keras' attention on JAX); the weights
        # meet `value` in its own dtype.
        heads_first = (0, 2, 1, 3)
        dtype = value.dtype
        query, key, value = (ops.transpose(t, heads_first) for t in (query, key, value))
        query, key = ops.cast(query, "float32") * scale, ops.cast(key, "float32")
        logits = ops.matmul(query, ops.swapaxes(key, -1, -2))
        for part in extra:
            logits = logits + part
        exponentials = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
        inverse_sums = 1.0 / ops.sum(exponentials, axis=-1, keepdims=True)
        output = ops.matmul(ops.cast(exponentials, dtype), value) * ops.cast(inverse_sums, dtype)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            d_output = ops.transpose(upstream, heads_first)
            weights = exponentials * inverse_sums
            correction = ops.sum(
                ops.cast(d_output, "float32") * ops.cast(output, "float32"), axis=-1, keepdims=True
            )
            d_weights = ops.cast(ops.matmul(d_output, ops.swapaxes(value, -1, -2)), "float32")
            d_logits = weights * (d_weights - correction)
            d_query = ops.matmul(d_logits, key) * scale
            d_key = ops.matmul(ops.swapaxes(d_logits, -1, -2), query)
            d_value = ops.matmul(ops.swapaxes(ops.cast(weights, dtype), -1, -2), d_output)
            grads = tuple(ops.cast(ops.transpose(g, heads_first), dtype) for g in (d_query, d_key, d_value))
            d_extra = [ops.zeros_like(part) for part in extra[:len(masks)]]
            for part in extra[len(masks):]:  # the learned bias: the logits' gradient, over the axes it broadcasts
                axes = tuple(axis for axis in range(4) if part.shape[axis] == 1 and d_logits.shape[axis] != 1)
                d_extra.append(ops.sum(d_logits, axis=axes, keepdims=True) if axes else d_logits)
            return (*grads, *d_extra)

        return ops.transpose(output, heads_first), grad

    return attend(query, key, value, *masks, *learned)


def gelu(x, approximate):
    """GELU, tanh-approximated or exact; `keras.ops.gelu` except for the exact form on TensorFlow.

    TensorFlow computes exact GELU as `0.5 x erfc(-x / sqrt(2))`, and ONNX
    has no `Erfc` operator, so tf2onnx could not export a model with exact
    GELU (every timm and transformers checkpoint). There it is written as
    `0.5 x (1 + erf(x / sqrt(2)))`, the same function (equal to float32
    rounding), which both converters map.

    Example:
    >>> import numpy as np
    >>> np.round(np.asarray(gelu(np.array([-1.0, 0.0, 1.0], "float32"), approximate=False), "float64"), 4).tolist()
    [-0.1587, 0.0, 0.8413]
    """
    if approximate or keras.backend.backend() != "tensorflow":
        return ops.gelu(x, approximate=approximate)
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def torch_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm of `x` over its last axis on PyTorch, in `x`'s own dtype, or None where torch cannot take the dtypes.

    Keras' `LayerNormalization` casts a bfloat16 input to float32, normalises
    it and casts the result back: three passes over the tokens, writing 12
    bytes an element where torch's `layer_norm` writes 2, since its kernel
    computes the statistics and the affine map in float32 itself and rounds
    once. The result is Keras' up to that one rounding (the two sums' order).
    Weights of another dtype than `x` (float32 `gamma` under
    `mixed_bfloat16`) are taken as they are on the CPU, whose kernel mixes
    dtypes; elsewhere torch's kernels want one dtype, and rounding float32
    weights to bfloat16 would change the result, so that case gives None
    (Keras' path).

    Example:
    >>> import numpy as np
    >>> x = np.arange(8.0, dtype="float32").reshape(2, 4)
    >>> keras.backend.backend() != "torch" or tuple(torch_layer_norm(x, None, None, 1e-6).shape) == (2, 4)
    True
    """
    from torch.nn import functional  # Only on the PyTorch backend, which has torch.

    x = ops.convert_to_tensor(x)
    weights = [None if w is None else ops.convert_to_tensor(w) for w in (gamma, beta)]
    if any(w is not None and w.dtype != x.dtype for w in weights) and x.device.type != "cpu":
        return None
    return functional.layer_norm(x, x.shape[-1:], *weights, epsilon)


def layer_norm(x, gamma, beta, epsilon):
    """Float32 LayerNorm of `x` over its last axis, with its two means as matrix products.

    `(x - mean) / sqrt(variance + epsilon) * gamma + beta` on float32
    inputs. The means are products with a `(width, 1)` averaging vector,
    which makes each normalisation's gradient a matrix product of its own:
    XLA's CPU backend otherwise fuses the elementwise LayerNorm gradients of
    all later blocks into every earlier block's backward pass, work that
    grows with the square of the depth. Where `use_custom_gradients()`, the
    gradient is written out, with the sums over tokens for `gamma` and
    `beta` as products with a row of ones instead of column reductions.
    See benchmarks/README.md.

    Example:
    >>> import numpy as np
    >>> x = np.arange(8.0, dtype="float32").reshape(2, 4)
    >>> tuple(layer_norm(x, np.ones(4, "float32"), np.zeros(4, "float32"), 1e-6).shape)
    (2, 4)
    """
    width = x.shape[-1]

    def normalize(x):
        average = ops.full((width, 1), 1.0 / width, dtype="float32")
        centred = x - ops.matmul(x, average)
        inverse_std = ops.rsqrt(ops.matmul(ops.square(centred), average) + epsilon)
        return centred * inverse_std, inverse_std, average

    if not use_custom_gradients():
        return normalize(x)[0] * gamma + beta

    @ops.custom_gradient
    def normalize_and_scale(x, gamma, beta):
        normalized, inverse_std, average = normalize(x)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            upstream = ops.cast(upstream, "float32")
            # Column sums as a row of ones times the (rows, width) matrix.
            rows = ops.reshape(upstream, (-1, width))
            # Shaped from `rows` itself: SavedModel export traces this with an unknown batch size.
            ones = ops.swapaxes(ops.ones_like(rows[:, :1]), 0, 1)
            d_beta = ops.matmul(ones, rows)[0]
            d_gamma = ops.matmul(ones, rows * ops.reshape(normalized, (-1, width)))[0]
            scaled = upstream * gamma
            d_x = inverse_std * (
                scaled - ops.matmul(scaled, average) - normalized * ops.matmul(scaled * normalized, average)
            )
            return d_x, d_gamma, d_beta

        return normalized * gamma + beta, grad

    return normalize_and_scale(x, gamma, beta)


def torch_adamw(variables, grads, momentums, velocities, step, learning_rate, groups, weight_decay, beta_1, beta_2,
                epsilon):
    """One step of torch's AdamW over Keras variables with per-variable rates, in place, by torch's `_foreach_` ops.

    `groups`: each variable's `(rate scale, decays)`; a group's variables step together, as
    `torch.optim.AdamW(foreach=True)` steps a param group: `optimizers.LayerDecayAdamW.update_step`'s arithmetic,
    which Keras runs one variable and one model-sized temporary at a time (benchmarks/optimizer_step.py).
    """
    import torch

    rate, correction_1 = float(learning_rate), 1 - beta_1 ** step
    for scale, decays, params, first, denominators in _adam_groups(variables, grads, momentums, velocities, step,
                                                                   groups, beta_1, beta_2, epsilon):
        if decays:
            torch._foreach_mul_(params, 1 - rate * scale * weight_decay)
        torch._foreach_addcdiv_(params, first, denominators, value=-rate * scale / correction_1)


def torch_lamb(variables, grads, momentums, velocities, step, learning_rate, groups, weight_decay, beta_1, beta_2,
               epsilon):
    """One step of timm's `Lamb` over Keras variables with per-variable rates, in place, by torch's `_foreach_` ops.

    `optimizers.LayerDecayLamb.update_step`'s arithmetic a param group at a time: Adam's update, and where the
    variable decays, the decay added and the whole scaled by its trust ratio `|p| / |update|` (1 where either is 0).
    The gradients come clipped (Keras' `global_clipnorm`, as timm's `max_grad_norm`).
    """
    import torch

    rate, correction_1 = float(learning_rate), 1 - beta_1 ** step
    for scale, decays, params, first, denominators in _adam_groups(variables, grads, momentums, velocities, step,
                                                                   groups, beta_1, beta_2, epsilon):
        updates = torch._foreach_div(first, correction_1)
        torch._foreach_div_(updates, denominators)
        if decays:
            torch._foreach_add_(updates, params, alpha=weight_decay)
            weight_norms = torch.stack(torch._foreach_norm(params))
            update_norms = torch.stack(torch._foreach_norm(updates))
            ratios = torch.where((weight_norms > 0) & (update_norms > 0),
                                 weight_norms / update_norms.clamp_min(1e-30), torch.ones_like(weight_norms))
            torch._foreach_mul_(updates, list(ratios.unbind()))
        torch._foreach_add_(params, updates, alpha=-rate * scale)


def _adam_groups(variables, grads, momentums, velocities, step, groups, beta_1, beta_2, epsilon):
    """Per param group, under `no_grad`: `(scale, decays, params, first moments, denominators)`, the moments
    updated in place (torch's `lerp_` and `addcmul_`) and the denominators `sqrt(v / (1 - b2^t)) + eps`."""
    import torch

    root_correction_2 = math.sqrt(1 - beta_2 ** step)
    members = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    with torch.no_grad():
        for (scale, decays), indices in members.items():
            params = [variables[i].value for i in indices]
            gradients = [grads[i].to(params[0].dtype) for i in indices]
            first, second = [momentums[i].value for i in indices], [velocities[i].value for i in indices]
            torch._foreach_lerp_(first, gradients, 1 - beta_1)
            torch._foreach_mul_(second, beta_2)
            torch._foreach_addcmul_(second, gradients, gradients, value=1 - beta_2)
            denominators = torch._foreach_sqrt(second)
            torch._foreach_div_(denominators, root_correction_2)
            torch._foreach_add_(denominators, epsilon)
            yield scale, decays, params, first, denominators
