"""One update of the fine-tuning optimizer, keras_vit's against the reference of its backend, on a CPU.

    KERAS_BACKEND=torch python benchmarks/optimizer_step.py [--model beitv2_base] [--rounds 7]
    KERAS_BACKEND=jax python benchmarks/optimizer_step.py

The variables are a keras_vit model's (BEiT v2 B/16's by default, or ViT-S/16's
with `--model vit_small`), with random gradients. keras_vit's update is
`recipes.finetuning_optimizer(opt="adamw", layer_decay=0.65)` (torch's AdamW
with timm's parameter groups), applied the way `model.fit` applies it:

- torch: `optimizer.apply(grads)`, against `torch.optim.AdamW(foreach=True)`
  over the same tensors in timm's groups (what timm's `create_optimizer_v2`
  builds), its `step()`;
- jax: Keras' stateless update under `jax.jit` (as the train step runs it),
  against `optax.adamw` with the groups' rates (`optax.multi_transform`), jitted.

It prints the median of `--rounds` interleaved rounds (10 updates each) with
their min and max, and keras_vit's time over the reference's.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.training import param_groups, recipes  # noqa: E402

MODELS = {"beitv2_base": dict(patch_size=16, hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072,
                              relative_position_bias="table", key_bias=False, layer_scale=0.1, class_token=True,
                              classifier="gap", fc_norm=True),
          "vit_small": dict(patch_size=16, hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536)}
UPDATES = 10


def keras_vit_update(model, groups):
    optimizer = recipes.finetuning_optimizer(1e-4, opt="adamw", layer_decay=0.65, model=model, global_clipnorm=None)
    variables = model.trainable_weights
    optimizer.build(variables)
    rng = np.random.default_rng(0)
    grads = [keras.ops.convert_to_tensor(rng.normal(0, 1e-3, v.shape).astype("float32")) for v in variables]
    if keras.backend.backend() != "jax":
        def run():
            for _ in range(UPDATES):
                optimizer.apply(grads, variables)
            keras.ops.convert_to_numpy(variables[0])
        return run
    import jax

    @jax.jit
    def update(values, state, grads):
        return optimizer.stateless_apply(state, grads, values)

    values = [v.value for v in variables]
    state = [v.value for v in optimizer.variables]

    def run():
        nonlocal values, state
        for _ in range(UPDATES):
            values, state = update(values, state, grads)
        jax.block_until_ready(values)
    return run


def reference_update(model, groups):
    rng = np.random.default_rng(0)
    shapes = [(v.path, tuple(v.shape)) for v in model.trainable_weights]
    if keras.backend.backend() == "torch":
        import torch

        params = {path: torch.nn.Parameter(torch.zeros(shape)) for path, shape in shapes}
        for path, parameter in params.items():
            parameter.grad = torch.from_numpy(rng.normal(0, 1e-3, parameter.shape).astype("float32"))
        by_group = {}
        for path, (scale, decays) in groups.items():
            by_group.setdefault((scale, decays), []).append(params[path])
        optimizer = torch.optim.AdamW([{"params": ps, "lr": 1e-4 * scale, "weight_decay": 0.05 if decays else 0.0}
                                       for (scale, decays), ps in by_group.items()], foreach=True)

        def run():
            for _ in range(UPDATES):
                optimizer.step()
        return run
    import jax
    import optax

    params = {path: jax.numpy.zeros(shape) for path, shape in shapes}
    grads = {path: jax.numpy.asarray(rng.normal(0, 1e-3, shape).astype("float32")) for path, shape in shapes}
    labels = {path: f"{scale}_{decays}" for path, (scale, decays) in groups.items()}
    transforms = {f"{scale}_{decays}": optax.adamw(1e-4 * scale, weight_decay=0.05 if decays else 0.0)
                  for scale, decays in set(groups.values())}
    optimizer = optax.multi_transform(transforms, labels)
    state = optimizer.init(params)

    @jax.jit
    def update(params, state, grads):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def run():
        nonlocal params, state
        for _ in range(UPDATES):
            params, state = update(params, state, grads)
        jax.block_until_ready(params)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="beitv2_base")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    model = keras_vit.ViT(image_size=224, classes=1000, **MODELS[args.model])
    groups = param_groups.parameter_groups(model, layer_decay=0.65)
    contenders = {"keras_vit": keras_vit_update(model, groups), "reference": reference_update(model, groups)}
    for run in contenders.values():
        run()  # warm up: build, compile
    times = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) / UPDATES * 1e3)
    reference = "torch.optim.AdamW(foreach=True)" if keras.backend.backend() == "torch" else "optax.adamw"
    for name, values in times.items():
        label = reference if name == "reference" else "keras_vit LayerDecayAdamW"
        print(f"{label}: {statistics.median(values):.1f} ms per update (min {min(values):.1f}, max {max(values):.1f})")
    ratio = statistics.median(times["keras_vit"]) / statistics.median(times["reference"])
    print(f"{args.model}, {keras.backend.backend()}, {len(groups)} variables: keras_vit / reference = {ratio:.2f}")


if __name__ == "__main__":
    main()
