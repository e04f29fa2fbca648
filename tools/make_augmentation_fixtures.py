"""Write tests/fixtures/timm_augmentation/: the statistics of timm's training augmentations, for keras_vit's to equal.

Run in the side venv of tools/make_fixtures.py (timm there, never in the project's venv):

    /work/refvenv/bin/python tools/make_augmentation_fixtures.py

`random_erasing.json`: timm's `RandomErasing(probability, mode="pixel")`
(timm/data/random_erasing.py, its `--reprob` / `--remode pixel`) on `DRAWS`
images of 24x40 zeros, per probability: the share of images erased, and
the mean and standard deviation of the erased boxes' heights, widths,
areas (as a share of the image), top and left offsets, and of the noise
in them (in the normalized space, where timm erases).

`mixing.json`: timm's `Mixup` with MixUp 0.8 and CutMix 1.0 (`mixing_statistics`).

`bce.json`: timm's `BinaryCrossEntropy` against targets made by timm's
`Mixup` (`bce_cases`).

`three_augment.npz`: timm's `--aa 3a --color-jitter 0.3` (the `3a` AutoAugment
policy, then torchvision's `ColorJitter`) on random images, with the draws
timm made for each (`three_augment_cases`).

`repeat_sampler.json`: timm's `RepeatAugSampler` (one replica) over data sets of
several sizes: its permutation and the indices it gives (`repeat_sampler_cases`).
"""

import json
import os
import random

import numpy as np
import torch

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "timm_augmentation")
HEIGHT, WIDTH, DRAWS = 24, 40, 20000


def erasing_statistics(probability):
    from timm.data.random_erasing import RandomErasing

    random.seed(0)
    torch.manual_seed(0)
    erase = RandomErasing(probability=probability, mode="pixel", device="cpu")
    heights, widths, tops, lefts, noise, erased = [], [], [], [], [], 0
    for _ in range(DRAWS):
        image = torch.zeros(3, HEIGHT, WIDTH)
        erase(image)
        rows, columns = np.nonzero((image != 0).any(0).numpy())
        if len(rows) == 0:
            continue
        erased += 1
        heights.append(rows.max() - rows.min() + 1)
        widths.append(columns.max() - columns.min() + 1)
        tops.append(rows.min())
        lefts.append(columns.min())
        noise.append(image[:, rows.min():rows.max() + 1, columns.min():columns.max() + 1].flatten().numpy())
    heights, widths = np.array(heights, float), np.array(widths, float)
    noise = np.concatenate(noise)
    summary = {"erased": erased / DRAWS, "count": erased}
    for name, values in (("height", heights), ("width", widths), ("area", heights * widths / (HEIGHT * WIDTH)),
                         ("top", np.array(tops, float)), ("left", np.array(lefts, float)), ("noise", noise)):
        summary[name] = [float(values.mean()), float(values.std())]
    return summary


def bce_cases():
    """timm's `BinaryCrossEntropy` of random logits against the targets timm's own `Mixup` makes (its
    `label_smoothing` applied there, upstream of the loss, as train.py builds them), with and without
    `target_threshold`. `unsmoothed` are those targets before the smoothing, `(mixed - s / K) / (1 - s)`: the
    one-hot rows Keras' MixUp mixes, which keras_vit's loss smooths itself."""
    from timm.data import Mixup
    from timm.loss import BinaryCrossEntropy

    torch.manual_seed(1)
    cases = []
    for smoothing, threshold in ((0.0, None), (0.1, None), (0.1, 0.2)):
        logits = torch.randn(8, 5) * 3
        labels = torch.randint(0, 5, (8,))
        _, mixed = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=smoothing, num_classes=5)(
            torch.zeros(8, 3, 4, 4), labels)
        loss = BinaryCrossEntropy(target_threshold=threshold)(logits, mixed)
        cases.append({"smoothing": smoothing, "threshold": threshold, "logits": logits.tolist(),
                      "unsmoothed": ((mixed - smoothing / 5) / (1 - smoothing)).tolist(), "loss": float(loss)})
    return cases


def mixing_statistics():
    """timm's `Mixup(mixup_alpha=0.8, cutmix_alpha=1.0)` (switch_prob 0.5, mode "batch") on `DRAWS` batches of two
    images, all 0 and all 1: the share of CutMix batches, and the mean and standard deviation of the first image's
    label weight under each, and of the CutMix box's height and width."""
    from timm.data import Mixup

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    mix = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=2, label_smoothing=0.0)
    weights = {"mixup": [], "cutmix": []}
    heights, widths = [], []
    for _ in range(DRAWS):
        images = torch.stack([torch.zeros(3, HEIGHT, WIDTH), torch.ones(3, HEIGHT, WIDTH)])
        images, targets = mix(images, torch.tensor([0, 1]))
        first = images[0, 0].numpy()
        if np.unique(first).size > 1 or (first.size and first.max() == 1.0 and float(targets[0, 0]) < 1):
            rows, columns = np.nonzero(first == 1.0)
            weights["cutmix"].append(float(targets[0, 0]))
            heights.append(rows.max() - rows.min() + 1 if len(rows) else 0)
            widths.append(columns.max() - columns.min() + 1 if len(columns) else 0)
        else:
            weights["mixup"].append(float(targets[0, 0]))
    summary = {"cutmix_share": len(weights["cutmix"]) / DRAWS, "counts": {k: len(v) for k, v in weights.items()}}
    for name, values in (("mixup_weight", weights["mixup"]), ("cutmix_weight", weights["cutmix"]),
                         ("box_height", heights), ("box_width", widths)):
        summary[name] = [float(np.mean(values)), float(np.std(values))]
    return summary


def three_augment_cases(count=24):
    """`count` random images through timm's 3-Augment and colour jitter, each with the op, blur radius, jitter
    order and factors timm drew for it (recorded by wrapping `random.choice`, `random.uniform` and
    `ColorJitter.get_params`)."""
    from PIL import Image
    from timm.data import auto_augment
    from torchvision import transforms

    policy = auto_augment.auto_augment_transform("3a", dict(translate_const=100, img_mean=(124, 116, 104)))
    jitter = transforms.ColorJitter(0.3, 0.3, 0.3)
    names = {"Desaturate": "Grayscale", "Solarize": "Solarize", "GaussianBlurRand": "GaussianBlur"}
    drawn = {}
    choice, uniform, get_params = random.choice, random.uniform, transforms.ColorJitter.get_params

    def recorded_choice(options):
        picked = choice(options)
        drawn["op"] = names[picked[0].name]
        return picked

    def recorded_uniform(low, high):
        drawn["radius"] = value = uniform(low, high)
        return value

    def recorded_params(*args):
        params = get_params(*args)
        drawn["order"] = [int(i) for i in params[0] if int(i) < 3]
        drawn["factors"] = [float(f) for f in params[1:4]]
        return params

    random.seed(0)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    images, outputs, ops, radii, orders, factors = [], [], [], [], [], []
    random.choice, random.uniform = recorded_choice, recorded_uniform
    transforms.ColorJitter.get_params = staticmethod(recorded_params)
    try:
        for index in range(count):
            image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
            if index % 4 == 0:  # smooth images too, where a blur moves little
                image = np.repeat(np.repeat(image[::4, ::4], 4, 0), 4, 1)
            drawn.clear()
            drawn["radius"] = 0.0
            out = np.asarray(jitter(policy(Image.fromarray(image))))
            images.append(image), outputs.append(out), ops.append(drawn["op"]), radii.append(drawn["radius"])
            orders.append(drawn["order"]), factors.append(drawn["factors"])
    finally:
        random.choice, random.uniform = choice, uniform
        transforms.ColorJitter.get_params = staticmethod(get_params)
    return dict(images=np.stack(images), outputs=np.stack(outputs), ops=np.array(ops), radii=np.array(radii),
                orders=np.array(orders), factors=np.array(factors))


def repeat_sampler_cases():
    """timm's `RepeatAugSampler(num_replicas=1, rank=0, num_repeats=3)` at epoch 1 for several data set sizes."""
    from timm.data.distributed_sampler import RepeatAugSampler

    cases = []
    for size in (10, 255, 256, 300, 700):
        sampler = RepeatAugSampler(list(range(size)), num_replicas=1, rank=0, num_repeats=3)
        sampler.set_epoch(1)
        generator = torch.Generator()
        generator.manual_seed(1)
        cases.append({"size": size, "permutation": torch.randperm(size, generator=generator).tolist(),
                      "indices": list(sampler), "length": len(sampler)})
    return cases


def main():
    import timm

    os.makedirs(OUT, exist_ok=True)
    result = {"timm": timm.__version__, "size": [HEIGHT, WIDTH], "draws": DRAWS,
              "probabilities": {str(p): erasing_statistics(p) for p in (0.25, 1.0)}}
    with open(os.path.join(OUT, "random_erasing.json"), "w") as file:
        json.dump(result, file, indent=1)
    with open(os.path.join(OUT, "mixing.json"), "w") as file:
        json.dump({"timm": timm.__version__, "size": [HEIGHT, WIDTH], "draws": DRAWS, **mixing_statistics()}, file,
                  indent=1)
    with open(os.path.join(OUT, "bce.json"), "w") as file:
        json.dump({"timm": timm.__version__, "cases": bce_cases()}, file, indent=1)
    np.savez_compressed(os.path.join(OUT, "three_augment.npz"), **three_augment_cases())
    with open(os.path.join(OUT, "repeat_sampler.json"), "w") as file:
        json.dump({"timm": timm.__version__, "cases": repeat_sampler_cases()}, file)


if __name__ == "__main__":
    main()
