import math

import keras
import numpy as np
import pytest
from test_layers import layer_norm_pair

from keras_vit import ViT
from keras_vit.layers import LayerNorm, TransformerBlock, kernels


def numpy_attention_and_gradients(q, k, v, d_output):
    """Attention on (batch, tokens, heads, dim) and its textbook backward pass, in float64."""
    q, k, v, d_output = (t.astype("float64").transpose(0, 2, 1, 3) for t in (q, k, v, d_output))
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = q @ k.swapaxes(-1, -2) * scale
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    d_weights = d_output @ v.swapaxes(-1, -2)
    d_logits = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True))
    results = (weights @ v, d_logits @ k * scale, d_logits.swapaxes(-1, -2) @ q * scale,
               weights.swapaxes(-1, -2) @ d_output)
    return [r.transpose(0, 2, 1, 3) for r in results]


def input_gradients(function, inputs, output_weights):
    """Gradients of `sum(function(*inputs) * output_weights)` for each input, on the current backend."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def total(*tensors):
            return (function(*tensors) * output_weights).sum()

        return [np.asarray(g) for g in jax.grad(total, argnums=tuple(range(len(inputs))))(*inputs)]
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            total = tf.reduce_sum(function(*tensors) * output_weights)
        return [g.numpy() for g in tape.gradient(total, tensors)]
    import torch

    tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
    (function(*tensors) * torch.tensor(output_weights)).sum().backward()
    return [t.grad.numpy() for t in tensors]


def record_calls(monkeypatch, owner, name):
    """Replace `owner.name` with a wrapper that records each call's keyword arguments."""
    calls = []
    real = getattr(owner, name)

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls


def attention_paths(monkeypatch):
    """Records which attention `TransformerBlock` goes through: the written-out or a fused one.

    The fused one is Keras' `dot_product_attention`, or on PyTorch torch's
    `scaled_dot_product_attention`, which keras_vit calls itself there.
    """
    if keras.backend.backend() == "torch":
        from torch.nn import functional

        fused = record_calls(monkeypatch, functional, "scaled_dot_product_attention")
    else:
        fused = record_calls(monkeypatch, keras.ops, "dot_product_attention")
    return record_calls(monkeypatch, kernels, "softmax_attention"), fused


def run_block():
    TransformerBlock(num_heads=2, mlp_dim=8)(np.zeros((1, 4, 8), "float32"))


def running_on_cpu():
    """Whether the backend computes on a CPU, asked of the backend itself rather than of keras_vit."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
    import torch

    return not torch.cuda.is_available()


@pytest.fixture
def custom_gradients():
    """Restores the process-wide custom-gradient setting after a test changes it."""
    previous = kernels.set_custom_gradients(True)
    yield kernels.set_custom_gradients
    kernels.set_custom_gradients(previous)


# --- softmax_attention --------------------------------------------------------


def test_softmax_attention_and_its_gradients_equal_numpy():
    rng = np.random.default_rng(12)
    q, k, v, d_output = (rng.normal(0.0, 2.0, size=(2, 7, 3, 8)).astype("float32") for _ in range(4))
    expected = numpy_attention_and_gradients(q, k, v, d_output)
    output = keras.ops.convert_to_numpy(kernels.softmax_attention(q, k, v))
    np.testing.assert_allclose(output, expected[0], atol=1e-5)
    np.testing.assert_allclose(output, keras.ops.convert_to_numpy(keras.ops.dot_product_attention(q, k, v)),
                               atol=1e-5)
    gradients = input_gradients(kernels.softmax_attention, [q, k, v], d_output)
    for name, got, want in zip(("query", "key", "value"), gradients, expected[1:]):
        np.testing.assert_allclose(got, want, atol=3e-5, err_msg=name)


def test_softmax_attention_keeps_the_input_dtype_and_computes_its_logits_in_float32():
    # Logits near 90 that differ by ~1: bfloat16 logits would be off by up to 0.25 (their
    # spacing there is 0.5), changing the weights by ~25%; float32 logits keep them exact.
    rng = np.random.default_rng(15)
    q, k, v = (rng.normal(size=(2, 9, 2, 8)).astype("float32") for _ in range(3))
    q[..., 0] = k[..., 0] = 16.0
    inputs = [keras.ops.cast(t, "bfloat16") for t in (q, k, v)]
    out = kernels.softmax_attention(*inputs)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    rounded = [keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")) for t in inputs]
    expected = numpy_attention_and_gradients(*rounded, np.zeros_like(q))[0]
    # What remains is bfloat16's own rounding of the weights and the output (2^-9 relative).
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")), expected, atol=2e-2)


# --- Which attention the block goes through -----------------------------------


@pytest.mark.parametrize("devices", [["cpu:0"], ["gpu:0", "gpu:1"], ["tpu:0"]])
def test_block_uses_the_written_out_attention_only_on_cpus_under_jax_and_tensorflow(monkeypatch, devices):
    monkeypatch.setattr(keras.distribution, "list_devices", lambda *a: devices)
    written_out, keras_attention = attention_paths(monkeypatch)
    run_block()
    on_cpu_under_xla = devices == ["cpu:0"] and keras.backend.backend() in ("jax", "tensorflow")
    assert (len(written_out), len(keras_attention)) == ((1, 0) if on_cpu_under_xla else (0, 1))


@pytest.mark.parametrize("device", ["cpu:0", "gpu:0", "tpu:0"])
def test_block_turns_flash_attention_off_only_on_tpu_under_jax(monkeypatch, custom_gradients, device):
    # Keras' JAX backend sends unmasked TPU attention to the Splash kernel, which masks causally.
    custom_gradients(False)
    monkeypatch.setattr(keras.distribution, "list_devices", lambda *a: [device])
    written_out, keras_attention = attention_paths(monkeypatch)
    run_block()
    expected = False if device == "tpu:0" and keras.backend.backend() == "jax" else None
    if device == "gpu:0" and keras.backend.backend() == "jax":
        expected = False  # keras_vit asks Keras' cuDNN check itself, and this machine has no cuDNN (logged once)
    if keras.backend.backend() == "torch":
        expected = "not passed"  # torch's own scaled_dot_product_attention chooses its kernel
    assert not written_out
    assert [call.get("flash_attention", "not passed") for call in keras_attention] == [expected]


def test_custom_gradients_are_used_on_this_cpu_until_turned_off(monkeypatch, custom_gradients):
    if not running_on_cpu():
        pytest.skip("the written-out gradients are for CPUs")
    written_out, keras_attention = attention_paths(monkeypatch)
    run_block()
    if keras.backend.backend() == "torch":
        assert (len(written_out), len(keras_attention)) == (0, 1), "torch keeps its fused attention"
    else:
        assert (len(written_out), len(keras_attention)) == (1, 0)
    assert custom_gradients(False) is True
    written_out.clear(), keras_attention.clear()
    run_block()
    assert (len(written_out), len(keras_attention)) == (0, 1)


def test_forward_mode_differentiation_needs_custom_gradients_off(custom_gradients):
    if keras.backend.backend() != "jax":
        pytest.skip("jax.jvp")
    import jax

    block = TransformerBlock(num_heads=2, mlp_dim=8)
    x = np.random.default_rng(16).normal(size=(1, 4, 8)).astype("float32")
    block.build(x.shape)
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(block, (x,), (x,))
    custom_gradients(False)
    _, tangent = jax.jvp(block, (x,), (x,))
    step = 1e-3
    finite_difference = (np.asarray(block(x + step * x)) - np.asarray(block(x - step * x))) / (2 * step)
    np.testing.assert_allclose(np.asarray(tangent), finite_difference, atol=2e-3)


def test_set_custom_gradients_takes_a_bool(custom_gradients):
    with pytest.raises(TypeError, match="set_custom_gradients takes True or False, got 'no'"):
        custom_gradients("no")
    assert kernels.set_custom_gradients(True) is True


def test_transformer_block_gradients_equal_with_and_without_custom_gradients(monkeypatch):
    x = np.random.default_rng(13).normal(size=(2, 5, 8)).astype("float32")
    d_output = np.random.default_rng(14).normal(size=x.shape).astype("float32")
    block = TransformerBlock(num_heads=2, mlp_dim=16, seed=3)
    block.build(x.shape)
    gradients = {}
    for custom in (True, False):
        monkeypatch.setattr(kernels, "use_custom_gradients", lambda value=custom: value)
        gradients[custom] = input_gradients(block, [x], d_output)[0]
    np.testing.assert_allclose(gradients[True], gradients[False], atol=2e-5)


def repeated_heads(kernel, heads, groups, width):
    """A grouped q/k/v kernel or bias (last axis: queries, then `heads / groups` key and value heads of `width`)
    as a full-attention one: each key/value head repeated for the query heads of its group."""
    queries = heads * width
    parts = np.split(kernel, [queries, queries + queries // groups], axis=-1)
    full = [np.repeat(part.reshape(*part.shape[:-1], -1, width), groups, axis=-2).reshape(*part.shape[:-1], queries)
            for part in parts[1:]]
    return np.concatenate([parts[0], *full], axis=-1)


@pytest.mark.parametrize("custom, torch_kernels", [(True, False), (False, True), (False, False)])
def test_grouped_query_attention_is_full_attention_with_each_key_value_head_repeated(monkeypatch, custom,
                                                                                     torch_kernels):
    # Query head h takes key/value head h // (num_heads / num_kv_heads), as timm's repeat_interleave, on every
    # attention path: the written-out one, torch's or Keras' fused one, and the one that returns its weights.
    monkeypatch.setattr(kernels, "use_custom_gradients", lambda: custom)
    monkeypatch.setattr(kernels, "use_torch_kernels", lambda: torch_kernels and keras.backend.backend() == "torch")
    x = np.random.default_rng(17).normal(size=(2, 5, 16)).astype("float32")
    d_output = np.random.default_rng(18).normal(size=x.shape).astype("float32")
    grouped = TransformerBlock(num_heads=4, num_kv_heads=2, mlp_dim=16, qk_norm=True, seed=5)
    full = TransformerBlock(num_heads=4, mlp_dim=16, qk_norm=True, seed=5)
    grouped.build(x.shape), full.build(x.shape)
    rng = np.random.default_rng(19)
    for ours, theirs in zip(grouped.weights, full.weights):
        value = rng.normal(size=ours.shape).astype("float32") * 0.5
        ours.assign(value)
        theirs.assign(repeated_heads(value, 4, 2, 4) if "/qkv/" in ours.path else value)
    results = [(keras.ops.convert_to_numpy(block(x)), input_gradients(block, [x], d_output)[0],
                keras.ops.convert_to_numpy(block(x, return_attention_weights=True)[1])) for block in (grouped, full)]
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


# --- layer_norm ---------------------------------------------------------------


@pytest.mark.parametrize("custom", [True, False])
@pytest.mark.parametrize("options", [{}, {"scale": False}, {"center": False}])
def test_layer_norm_gradients_equal_keras_layer_normalization(options, custom, custom_gradients):
    custom_gradients(custom)
    if keras.backend.backend() == "torch":
        pytest.skip("on torch LayerNorm is Keras' own kernel")
    x = np.random.default_rng(9).normal(2.0, 3.0, size=(3, 7, 16)).astype("float32")
    ours, reference = layer_norm_pair(x, **options)
    weights = np.random.default_rng(10).normal(size=x.shape).astype("float32")
    values = [keras.ops.convert_to_numpy(v) for v in ours.trainable_variables]

    def gradients(layer):
        def function(inputs, *variables):
            return layer.stateless_call(list(variables), [], inputs)[0]

        return input_gradients(function, [x, *values], weights)

    names = ["inputs"] + [v.name for v in ours.trainable_variables]
    assert len(names) == 3 - len(options)
    for name, got, want in zip(names, gradients(ours), gradients(reference)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_equals_the_exact_and_tanh_formulas(approximate):
    from scipy.special import erf

    x = np.linspace(-6, 6, 1001).astype("float32")
    if approximate:
        expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype("float64") ** 3)))
    else:
        expected = 0.5 * x * (1 + erf(x.astype("float64") / np.sqrt(2)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(kernels.gelu(x, approximate)), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_layer_norm_takes_the_matrix_product_means_only_on_cpus(platform, monkeypatch):
    calls = []
    original = kernels.layer_norm
    monkeypatch.setattr(kernels, "_platform", lambda: platform)
    monkeypatch.setattr(kernels, "layer_norm", lambda *args: calls.append(platform) or original(*args))
    x = np.random.default_rng(11).normal(size=(2, 3, 8)).astype("float32")
    ours, reference = layer_norm_pair(x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(reference(x)),
                               atol=1e-5)
    expected = platform == "cpu" and keras.backend.backend() in ("jax", "tensorflow")
    assert bool(calls) == expected


def test_layer_norm_on_accelerators_keeps_float32_precision_where_bfloat16_matrix_means_would_not(monkeypatch):
    """A TPU's default float32 matrix product is one bfloat16 pass; the LayerNorm used there must not depend on it."""
    import ml_dtypes

    x = (np.random.default_rng(12).normal(0.0, 1.0, size=(4, 9, 64)) + 300.0).astype("float32")
    wide = x.astype("float64")
    expected = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-6)
    monkeypatch.setattr(kernels, "_platform", lambda: "tpu")
    ours, _ = layer_norm_pair(x)
    gamma, beta = (keras.ops.convert_to_numpy(v) for v in (ours.gamma, ours.beta))
    error = np.abs((keras.ops.convert_to_numpy(ours(x)) - beta) / gamma - expected).max()
    bound = 2e-4  # float32 rounding of inputs near 300 (an ulp is 3e-5) over unit spread
    assert error < bound

    def bfloat16(array):
        return array.astype(ml_dtypes.bfloat16).astype("float32")

    # The matrix-product means with each product's operands rounded as a bfloat16 pass rounds them.
    average = np.full((64, 1), 1 / 64, "float32")
    centred = x - bfloat16(x) @ bfloat16(average)
    variance = bfloat16(centred**2) @ bfloat16(average)
    matrix_means_error = np.abs(centred / np.sqrt(variance + 1e-6) - expected).max()
    assert matrix_means_error > 100 * bound


# --- linear -------------------------------------------------------------------

def test_blocks_take_torchs_fused_linear_and_attention_only_on_pytorch_with_the_keras_ops_results(monkeypatch):
    """The fused paths compute what Keras' Dense and attention compute: outputs and gradients equal to rounding."""
    x = np.random.default_rng(15).normal(size=(2, 5, 8)).astype("float32")
    d_output = np.random.default_rng(16).normal(size=x.shape).astype("float32")
    block = TransformerBlock(num_heads=2, mlp_dim=16, seed=4)
    block.build(x.shape)
    assert kernels.use_torch_kernels() is (keras.backend.backend() == "torch")
    if keras.backend.backend() != "torch":
        return  # The fused paths are torch's functions.
    from torch.nn import functional

    fused_calls, linear, sdpa = [], functional.linear, functional.scaled_dot_product_attention
    monkeypatch.setattr(functional, "linear", lambda *args: fused_calls.append(1) or linear(*args))
    monkeypatch.setattr(functional, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: fused_calls.append(q.is_contiguous()) or sdpa(q, *args, **kwargs))
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(kernels, "use_torch_kernels", lambda value=fused: value)
        fused_calls.clear()
        results[fused] = (keras.ops.convert_to_numpy(block(x)), input_gradients(block, [x], d_output)[0])
        # Twice (outputs, gradients): qkv, the strided attention, projection, 2 MLP layers; else Keras' copies.
        expected = [1, False, 1, 1, 1] * 2 if fused else [True] * 2
        assert fused_calls == expected
    for got, want in zip(results[True], results[False]):
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16", "float16"])
def test_fused_linear_keeps_keras_dense_results_in_half_precision_and_with_lora(monkeypatch, dtype):
    from keras_vit.layers.dense import Dense

    x = np.random.default_rng(17).normal(size=(3, 4, 16)).astype("float32")
    ours, keras_dense = (kind(24, dtype=dtype, bias_initializer="glorot_uniform") for kind in (Dense, keras.layers.Dense))
    ours.build(x.shape)
    keras_dense.build(x.shape)
    ours.enable_lora(2, b_initializer="glorot_uniform")
    keras_dense.enable_lora(2)
    keras_dense.set_weights(ours.get_weights())
    fused_calls = []
    if keras.backend.backend() == "torch":
        from torch.nn import functional

        monkeypatch.setattr(functional, "linear", lambda *args, real=functional.linear: fused_calls.append(1)
                            or real(*args))
    got, want = (ours(x), keras_dense(x))
    # float16 matrix products on a CPU: Keras' torch backend computes them in float32, and so does the fallback.
    assert bool(fused_calls) == (keras.backend.backend() == "torch" and dtype != "float16")
    assert keras.backend.standardize_dtype(got.dtype) == keras.backend.standardize_dtype(want.dtype)
    got, want = (keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")) for t in (got, want))
    np.testing.assert_allclose(got, want, atol=0.05, rtol=0.02)  # one half-precision rounding apart at most


# --- what a step pays besides compute (issue 57) ----------------------------------


class _CastBytes:
    """Bytes written by torch ops that change a tensor's dtype while active (a `TorchDispatchMode`)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        import torch

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                source = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if isinstance(result, torch.Tensor) and source is not None and result.dtype != source.dtype:
                    counter.bytes += result.numel() * result.element_size()
                return result

        self.bytes, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@pytest.mark.parametrize("policy", ["float32", "bfloat16", "mixed_bfloat16"])
def test_layer_norm_on_torch_casts_no_tokens_and_keeps_keras_results(policy):
    if keras.backend.backend() != "torch":
        pytest.skip("torch's layer_norm is the PyTorch backend's path")
    x = np.random.default_rng(12).normal(1.0, 2.0, size=(2, 197, 64)).astype("float32")
    ours, reference = LayerNorm(epsilon=1e-6, dtype=policy), keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)
    for layer in (ours, reference):
        layer.build(x.shape)
        layer.gamma.assign(np.linspace(0.5, 1.5, 64)), layer.beta.assign(np.linspace(-0.2, 0.2, 64))
    tokens = keras.ops.cast(x, ours.compute_dtype)
    with _CastBytes() as casts:
        found = ours(tokens)
    expected = reference(tokens)
    assert found.dtype == expected.dtype
    found, expected = (keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")) for t in (found, expected))
    if policy == "float32":
        np.testing.assert_array_equal(found, expected)
    else:  # one bfloat16 rounding of the same float32 result: at most one unit in the last place apart
        np.testing.assert_array_less(np.abs(found - expected), np.abs(expected) * 2.0**-7 + 1e-30)
        assert np.mean(found == expected) > 0.99
    assert casts.bytes <= 64 * 4 * 2  # the weights at most (bfloat16 gamma and beta); never the tokens


def test_outputs_to_numpy_reads_bfloat16_bits_as_keras_converts_them():
    from keras_vit.utils.keras_internals import outputs_to_numpy

    values = np.array([[0.0, -0.0, 1.5, -3.25e-5, 3.0e38, np.inf, -np.inf, np.nan]], "float32")
    tensor = keras.ops.convert_to_tensor(values, "bfloat16")
    found = outputs_to_numpy({"tokens": tensor, "count": keras.ops.ones((2,), "int32")})
    expected = keras.ops.convert_to_numpy(tensor)
    assert found["tokens"].dtype == expected.dtype and found["count"].tolist() == [1, 1]
    numbers = ~np.isnan(values)  # Keras' float32 round trip makes every NaN the canonical one; the bits keep it
    np.testing.assert_array_equal(found["tokens"].view("uint16")[numbers], expected.view("uint16")[numbers])
    assert np.isnan(found["tokens"].astype("float32")[~numbers]).all()
    found["tokens"][0, 0] = 7  # an array of its own, as Keras gives
    assert float(keras.ops.convert_to_numpy(keras.ops.cast(tensor, "float32"))[0, 0]) == 0.0


def test_predict_gives_the_forward_passes_bfloat16_outputs_without_keras_host_conversion(monkeypatch):
    if keras.backend.backend() != "torch":
        pytest.skip("Keras' slow bfloat16 conversion is its torch backend's (JAX's jitted step rounds otherwise)")
    from keras.src import backend as keras_backend

    model = ViT(image_size=32, patch_size=16, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, include_top=False,
                dtype="bfloat16")
    images = np.random.default_rng(13).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(images, training=False)).view("uint16")
    given = []  # what Keras' predict hands its convert_to_numpy
    convert = keras_backend.convert_to_numpy
    monkeypatch.setattr(keras_backend, "convert_to_numpy", lambda x: given.append(x) or convert(x))
    np.testing.assert_array_equal(model.predict_on_batch(images).view("uint16"), expected)
    np.testing.assert_array_equal(model.predict(images, batch_size=2, verbose=0).view("uint16"), expected)
    assert given and all(isinstance(x, np.ndarray) for x in given), [type(x) for x in given]  # Keras only copies


@pytest.mark.parametrize("policy", ["float32", "bfloat16", "mixed_bfloat16"])
def test_float32_models_trace_float32_products_on_a_jax_gpu(monkeypatch, policy):
    if keras.backend.backend() != "jax":
        pytest.skip("XLA's TF32 default is JAX's")
    import jax

    model = ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, classes=3,
                dtype=policy)
    values = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])

    def precisions(platform):  # as the model's call is traced on that platform
        monkeypatch.setattr(kernels, "_platform", lambda: platform)
        program = jax.make_jaxpr(lambda t, n, x: model.stateless_call(t, n, x, training=False)[0])(
            *values, np.zeros((1, 16, 16, 3), "float32"))
        return [str(e.params.get("precision")) for e in program.jaxpr.eqns
                if e.primitive.name in ("dot_general", "conv_general_dilated")]

    on_gpu = precisions("gpu")
    assert len(on_gpu) >= 7  # the patches' convolution, qkv, attention's two, projection, the MLP's two, the head
    highest = [p for p in on_gpu if "HIGHEST" in p]
    assert len(highest) == (len(on_gpu) if policy == "float32" else 0), on_gpu
    assert not [p for p in precisions("cpu") if "HIGHEST" in p]
    with jax.default_matmul_precision("tensorfloat32"):  # the user's own setting is kept
        assert not [p for p in precisions("gpu") if "HIGHEST" in p]


def test_attention_falling_back_from_cudnn_on_a_jax_gpu_is_logged_once(monkeypatch, caplog):
    if keras.backend.backend() != "jax":
        pytest.skip("Keras chooses cuDNN's fused attention on JAX")
    monkeypatch.setattr(kernels, "_platform", lambda: "gpu")
    monkeypatch.setattr(kernels, "_flash_attention_refusals_logged", set())
    q = np.random.default_rng(14).normal(size=(2, 5, 2, 8)).astype("float32")
    flags = record_calls(monkeypatch, keras.ops, "dot_product_attention")
    with caplog.at_level("WARNING", logger="keras_vit"):
        for dtype in ("bfloat16", "bfloat16", "float32"):
            t = keras.ops.convert_to_tensor(q, dtype)
            kernels.attention(t, t, t)
    assert [call["flash_attention"] for call in flags] == [False, False, False]  # this CPU has no cuDNN
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "keras_vit: attention runs XLA's kernel, not cuDNN's fused one (RuntimeError: cuDNN is not detected.).",
        "keras_vit: attention runs XLA's kernel, not cuDNN's fused one (cuDNN's fused attention takes bfloat16 or "
        "float16, not float32).",
    ]
