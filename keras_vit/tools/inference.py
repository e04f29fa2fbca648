"""Using a trained model: evaluate, predict, inspect, convert, export; each takes plain arguments.

`weights` is a `.keras` file, or anything else `keras_vit.from_pretrained`
reads (an original `.npz`, a `.weights.h5` file, a timm or transformers
file or folder, an `hf://org/name` handle), or a named checkpoint; for all
but `.keras` `model` (a variant name), else the checkpoint's own sizes,
else `sizes` say what to build.
"""

import dataclasses
import json
import os

import keras
import numpy as np

from keras_vit import checkpoints, data
from keras_vit.applications.pretrained import top_options
from keras_vit.applications.vit import ViT
from keras_vit.configs import check_sizes_agree, model_sizes, raise_all
from keras_vit.data import arrays, naflex
from keras_vit.data.imagenet import decode_predictions, imagenet_labels
from keras_vit.model import deployment
from keras_vit.model.description import is_naflex, sizes_of
from keras_vit.model.variants import SMALL_VIT, Variant
from keras_vit.model.vision_transformer import eval_transform, native_image_size
from keras_vit.training import accuracy_metrics
from keras_vit.utils import files
from keras_vit.utils.keras_internals import load_model_without_initializers
from keras_vit.utils.shapes import as_pair


def _given(sizes):
    """Sizes the caller set: all of a `Variant`, or the entries of a dict (`{"hidden_size": 32}`)."""
    return dataclasses.asdict(sizes) if isinstance(sizes, Variant) else dict(sizes or {})


def load_for_inference(weights, model=None, image_size=None, sizes=None, needs_head=True, drop_remainder=False):
    """A model from `weights` (what `keras_vit.from_pretrained` reads, or a named checkpoint), refused if any is NaN.

    `sizes` (a `Variant`, or a dict of some of its fields) build a model for
    a file that does not say its own; where the file or `model` says them,
    they must agree. `image_size` defaults to the checkpoint's own (else 32).
    With `needs_head=False`, a file without a head builds a model without
    one (its token sequence), for tools that read attention, not classes.
    `drop_remainder` builds an `image_size` the patches do not divide.
    A NaFlex checkpoint (timm's NaFlexVit, SigLIP 2) or `.keras` model loads
    as a NaFlex model, which the tools feed each photo whole, by its
    `naflex_preprocessing`.
    """
    if weights is None:
        raise ValueError("weights=None is an untrained model, with nothing to show: pass weights=PATH, a trained "
                         "model or checkpoint.")
    given = _given(sizes)
    if weights.endswith(".keras") and os.path.exists(weights):
        network = load_model_without_initializers(weights, compile=False)  # on JAX: seconds sooner
        checkpoints.check_finite(network, weights)
        check_sizes_agree(sizes_of(network), f"--weights {weights}", given)
        return network
    source = checkpoints.read_weights(weights, model, as_pair(image_size or 32, "image_size")).with_heads(
        given.get("num_heads"))
    # At the file's own size, what its patches do not cover is left out, as its library and from_pretrained do.
    drop_remainder = drop_remainder or (not image_size and source.input_size is not None)
    image_size = as_pair(image_size, "image_size") if image_size else (source.image_size or (32, 32))
    headless = "head/kernel" not in source.state
    if needs_head and headless:
        raise ValueError(f"{weights} has no classifier head: it is a feature model (as DINOv2's, CLIP's and SigLIP's "
                         "towers); take its features with keras_vit.from_pretrained and keras_vit.feature_extractor, "
                         "or fine-tune a head: keras-vit finetune --weights ...")
    default = dataclasses.replace(SMALL_VIT, **given)
    sizes = model_sizes(model, source, default, given)
    return ViT(image_size=image_size, **sizes.__dict__, weights=source, classifier_activation=None,
               include_top=not headless, drop_remainder=drop_remainder)


def _check_has_classifier(model, weights):
    if len(model.output_shape) != 2:
        raise ValueError(
            f"{weights} is an encoder without a classifier (its output has shape {model.output_shape}), "
            "for example from `pretrain --objective masked-patch`; fine-tune it first: "
            f"keras-vit finetune --weights {weights}"
        )


def outputs_logits(model):
    """Whether `model` ends in logits (no softmax on its "predictions" layer)."""
    try:
        activation = model.get_layer("predictions").activation
    except ValueError:
        return True
    return activation is keras.activations.linear or getattr(activation, "__name__", "") == "linear"


def naflex_options(network, weights, max_patches=None, crop_fraction=None, interpolation=None, image_size=None):
    """A NaFlex model's `naflex_batch` keywords (its `naflex_preprocessing`, else keras_vit's own) with
    `max_patches` or `interpolation` in place of its own; None for a fixed-size model, which takes no
    `max_patches`."""
    if not is_naflex(network):
        if max_patches is not None:
            raise ValueError(f"max_patches={max_patches} sets a NaFlex model's patch budget; {weights} takes "
                             f"{native_image_size(network)[0]}x{native_image_size(network)[1]} px images: leave "
                             "it out, or set their size with image_size=.")
        return None
    if image_size is not None:
        raise ValueError(f"image_size={image_size} sizes the images of fixed-size models; {weights} is a NaFlex "
                         "model, which sees each image whole at its own grid: leave it out, or set its patch budget "
                         "with max_patches=.")
    if crop_fraction is not None:
        raise ValueError(f"crop_fraction={crop_fraction} crops the images of fixed-size models; {weights} is a "
                         "NaFlex model, which sees the whole image: leave it out, or set its patch budget with "
                         "max_patches=.")
    return data.naflex_preprocessing(getattr(network, "naflex_preprocessing", None), max_patches, interpolation)


def evaluate(weights="runs/finetune/model.keras", dataset="digits", eval_split="test", data_dir=None,
             eval_batch_size=256, verbose=1, model=None, image_size=None, sizes=None, crop_fraction=None,
             interpolation=None, drop_remainder=False, max_patches=None, holdout_fraction=None):
    """Top-1 and top-5 (with more than 5 classes) of a saved model on a data-set split; prints which images it
    scores and the accuracies, and returns Keras' results dict.

    Images are preprocessed as the checkpoint's library evaluates it
    (`keras_vit.eval_transform`), with `crop_fraction` or `interpolation`
    in place of its own where given. A NaFlex model's are cut by its
    `naflex_preprocessing` (`max_patches` in place of its budget) into
    batches of one sequence length each (`keras_vit.data.naflex_batches`).
    An image folder without split sub-folders is evaluated whole, or with
    `holdout_fraction` only the part of each class that fine-tuning with
    that fraction held out (`keras_vit.data.load_source`).
    """
    if holdout_fraction is not None and not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be between 0 and 1, got {holdout_fraction}.")
    network = load_for_inference(weights, model, image_size, sizes, drop_remainder=drop_remainder)
    _check_has_classifier(network, weights)
    naflex = naflex_options(network, weights, max_patches, crop_fraction, interpolation, image_size)
    image_size = native_image_size(network)
    num_classes = network.output_shape[-1]
    names = _saved_class_names(network, weights)
    source = data.load_source(dataset, eval_split, data_dir, image_size, class_names=names,
                              holdout_fraction=holdout_fraction)
    if source.num_classes != num_classes:
        raise ValueError(
            f"{weights} has {num_classes} classes but {dataset!r} ({eval_split}) has {source.num_classes}: "
            "evaluate a model on the data set it was trained for."
        )
    if naflex is None:
        transform = eval_transform(network, crop_fraction=crop_fraction, interpolation=interpolation)
        batches = data.make_dataset(source, image_size, eval_batch_size, training=False, one_hot=True,
                                    num_classes=num_classes, eval_transform=transform)
    else:
        from keras_vit.data.naflex_batches import NaFlexEvaluationBatches

        batches = NaFlexEvaluationBatches(source, sizes_of(network).patch_size, eval_batch_size, naflex,
                                num_classes=num_classes, one_hot=True)
    loss = keras.losses.CategoricalCrossentropy(from_logits=outputs_logits(network))
    network.compile(loss=loss, metrics=accuracy_metrics(num_classes))
    print(f"evaluating {_evaluated_images(dataset, eval_split, source.num_examples, holdout_fraction)}")
    results = network.evaluate(batches, verbose=verbose, return_dict=True)
    print(f"top-1 accuracy: {results['top1']:.4f}")
    if "top5" in results:
        print(f"top-5 accuracy: {results['top5']:.4f}")
    return results


def _evaluated_images(dataset, split, count, holdout_fraction):
    """Which images `evaluate` scores, in words."""
    if not os.path.isdir(dataset):
        return f"the {count} images of {dataset}'s {split!r} split"
    folder = data.split_folder(dataset, split)
    if folder is not None:
        return f"the {count} images of {os.path.join(dataset, folder)}"
    if holdout_fraction is not None:
        return (f"the {count} images of {dataset} that fine-tuning with --holdout-fraction {holdout_fraction:g} held "
                f"out ({holdout_fraction:.0%} of each class, the same on every run)")
    return (f"all {count} images of {dataset}, which has no train/test sub-folders (--holdout-fraction scores only "
            "the part fine-tuning held out)")


def _read_names(path, model):
    """The class names in a text file, one a line, checked against the model's outputs."""
    try:
        with open(path, encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file of class names (one name a line, UTF-8).") from None
    if len(names) != model.output_shape[-1]:
        raise ValueError(f"{path} lists {len(names)} class names but the model has {model.output_shape[-1]} outputs.")
    return names


def _saved_class_names(model, weights):
    """The classes.txt that training wrote beside `weights`, or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(weights or "")), "classes.txt")
    return _read_names(path, model) if os.path.exists(path) else None


def class_names(model, weights=None, labels=None):
    """Names for the model's outputs: the `labels` file, classes.txt beside `weights`, the checkpoint's, or ImageNet's."""
    if labels:
        return _read_names(labels, model)
    saved = _saved_class_names(model, weights)
    if saved is not None:
        return saved
    if getattr(model, "class_names", None):
        return list(model.class_names)
    if model.output_shape[-1] == 1000:
        return [name for _, name in imagenet_labels()]
    return [str(i) for i in range(model.output_shape[-1])]


def predict(images, weights="runs/finetune/model.keras", labels=None, crop_fraction=None, model=None,
            image_size=None, sizes=None, interpolation=None, drop_remainder=False, max_patches=None, topk=5,
            as_json=False):
    """Print the `topk` classes of each image with their probabilities; returns `[(name, probability)] * topk` per
    image.

    `images` are image files or folders (every image in a folder, its
    sub-folders' too, sorted). Each photo is preprocessed as the
    checkpoint's library evaluates it (`keras_vit.eval_transform`: timm's
    crop_pct and filter, transformers' image processor, vit_jax's squash),
    with `crop_fraction` or `interpolation` in place of its own where given.
    A NaFlex model takes each photo whole, cut by its `naflex_preprocessing`
    (`naflex_batch`; `max_patches` in place of its budget), one compiled
    step per bucket, and each photo's patch grid is printed with it. With
    `as_json`, stdout gets one JSON list instead, an object per image:
    `{"image", "classes": [{"name", "probability"}, ...]}` (and `"patch_grid"`).
    """
    paths = _image_paths(images)
    if topk < 1:
        raise ValueError(f"topk must be at least 1, got {topk}.")
    network = load_for_inference(weights, model, image_size, sizes, drop_remainder=drop_remainder)
    _check_has_classifier(network, weights)
    naflex = naflex_options(network, weights, max_patches, crop_fraction, interpolation, image_size)
    if naflex is None:
        transform = eval_transform(network, crop_fraction=crop_fraction, interpolation=interpolation)
    names, logits = class_names(network, weights, labels), outputs_logits(network)
    results, report = [], []
    for path in paths:
        if naflex is None:
            batch = transform.load(path)[None]
        else:
            batch = data.naflex_batch([arrays.decode_image(path)], sizes_of(network).patch_size, **naflex)
        # One compiled step for every image of a size (on JAX a call op by op compiled each op: seconds).
        best = decode_predictions(network.predict_on_batch(batch), topk, names, from_logits=logits)[0]
        results.append([(name, probability) for _, name, probability in best])
        grid = None if naflex is None else [int(side) for side in batch["patch_grid"][0]]
        if as_json:
            report.append({"image": path, "classes": [{"name": name, "probability": probability}
                                                      for _, name, probability in best]})
            if grid is not None:
                report[-1]["patch_grid"] = grid
            continue
        print(path if grid is None else f"{path}  (NaFlex patch grid {grid[0]}x{grid[1]})")
        for _, name, probability in best:
            print(f"  {name:>24s}  {probability:.4f}")
    if as_json:
        print(json.dumps(report, indent=1))
    return results


def _image_paths(images):
    """The image files `images` (files and folders) name, every one of a folder; all that are missing, in one
    error."""
    paths, problems = [], []
    for path in images:
        if os.path.isdir(path):
            found = data.image_files(path)
            paths += found
            if not found:
                problems.append(FileNotFoundError(f"No images found under {path} (extensions "
                                                  f"{', '.join(data.IMAGE_EXTENSIONS)})."))
        elif os.path.exists(path):
            paths.append(path)
        else:
            problems.append(FileNotFoundError(f"Image not found: {path}"))
    raise_all(problems)
    return paths


def inspect(image, weights="runs/finetune/model.keras", output_dir="runs/inspect", model=None, image_size=None,
            sizes=None, drop_remainder=False):
    """Write attention rollout, mean attention distance, position-embedding and filter plots of one image file."""
    from keras_vit.tools import analysis

    network = load_for_inference(weights, model, image_size, sizes, needs_head=False, drop_remainder=drop_remainder)
    if not os.path.exists(image):
        raise FileNotFoundError(f"Image not found: {image}")
    if is_naflex(network):  # the whole photo at the largest grid of its budget, as predict cuts it
        pixels = naflex.naflex_resize(arrays.open_rgb(image), sizes_of(network).patch_size,
                                      **naflex_options(network, weights))
    else:
        pixels = np.clip(np.round(eval_transform(network).pixels(arrays.open_rgb(image))), 0, 255).astype("uint8")
    written = analysis.inspect(network, pixels, output_dir)
    for path in written.values():
        print("wrote", path)
    return written


def convert(weights, output, model=None, image_size=None, classes=None, num_heads=None, drop_remainder=False):
    """Convert a checkpoint (what `from_pretrained` reads, or a name with `model`) to a `.keras` file.

    `image_size` and `classes` default to the checkpoint's own, `num_heads`
    to the file's (for a file that does not store it); a file without a head
    writes the feature model `from_pretrained` builds, unless `classes` asks
    for a new head. Returns the model.
    """
    source = checkpoints.read_weights(weights, model, as_pair(image_size or 224, "image_size")).with_heads(num_heads)
    if num_heads and source.num_heads and num_heads != source.num_heads:
        raise ValueError(f"--num-heads {num_heads} disagrees with {weights}, whose num_heads is {source.num_heads}; "
                         "leave it out to use the file's.")
    if num_heads and not model:
        source = dataclasses.replace(source, num_heads=num_heads)
    sizes = model_sizes(model, source, None)
    if sizes is None:
        raise ValueError(
            f"{weights} does not store all its sizes (a .weights.h5 file or a bare state dict has no head count); "
            "name its variant with `model` (--model), e.g. ViT_B16, or pass `num_heads` (--num-heads)."
        )
    drop_remainder = drop_remainder or (not image_size and source.input_size is not None)  # as from_pretrained
    image_size = image_size or source.image_size or 224
    given = {} if classes is None else {"classes": classes}
    network = ViT(image_size=image_size, **sizes.__dict__, weights=source, drop_remainder=drop_remainder,
                  **top_options(source, given), **given, **({"name": source.name} if source.name else {}))
    with files.atomic_path(output) as path:  # A failed write keeps any earlier file whole.
        network.save(path)
    takes = "NaFlex patch sequences of any grid" if is_naflex(network) else f"{image_size} px"
    print(f"wrote {output}: {network.name}, {network.count_params():,} parameters, {takes}")
    return network


def export(source, output=None, format="onnx", quantize=None, num_heads=None):
    """Export a model for serving; returns the path written.

    `source` is a `.keras` file or anything `keras_vit.from_pretrained` reads
    (an original `.npz`, a timm or transformers file or folder, an `hf://`
    handle; `num_heads` for a file that does not store its head count);
    `output` defaults to the source's name with the format's ending
    (`vit.onnx`, `vit.tflite`, `vit_saved_model/`). See `keras_vit.model.deployment`.
    """
    deployment.check_format(format, quantize)  # A wrong backend or a missing package, before loading anything.
    if source.endswith(".keras") and os.path.exists(source):
        network = load_for_inference(source)
    else:
        from keras_vit.applications.pretrained import from_pretrained

        network = from_pretrained(source, **({"num_heads": num_heads} if num_heads else {}))
    output = output or deployment.default_path(source, format)
    network.export(output, format=format, quantize=quantize)
    what = f"{format}, int8" if quantize else format
    print(f"wrote {output} ({what}): {network.name}, {network.count_params():,} parameters, "
          f"input {(None, *network.input_shape[1:])}")
    return output
