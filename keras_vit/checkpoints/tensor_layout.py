"""Weight layouts as declared tables, and the one converter that applies them.

A layout (timm's `VisionTransformer`, transformers' ViT, DINOv2 and CLIP or SigLIP towers) is data: a
`TensorLayout` names, for each tensor of the file, the keras_vit weight it is, and which tensors are q, k and v
kept apart, a buffer the model does not compute with, or a tensor that needs reshaping. `TensorLayout.read`
applies any such table: it strips the file's prefix, maps the top level and each block, fuses q/k/v (each
checked against its own shape first), and refuses every name the table does not know; `TensorLayout.origins`
gives each weight's name in the file, which later refusals name. keras_vit's own weights are declared in
`model_weights`, so the integrity rule, that a file holds exactly the tensors of the model its config describes,
is checked once for every layout (`TensorLayout.check_complete`), in the file's own names.

Example:
>>> import numpy as np
>>> layout = TensorLayout("a toy layout", top={"pos": "position_embedding/pos_embedding"}, block_prefix="layers.",
...                       block={"fc.weight": "mlp_hidden/kernel"})
>>> sorted(layout.read({"pos": np.zeros((1, 4, 2)), "layers.0.fc.weight": np.zeros((3, 2))}, "toy"))
['encoderblock_0/mlp_hidden/kernel', 'position_embedding/pos_embedding']
"""

import dataclasses
import json

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, preview, refuse_non_float
from keras_vit.checkpoints.model_weights import (  # noqa: F401 - declared there, read here (and by the tests) too
    BLOCK_WEIGHTS,
    MODEL_WEIGHTS,
    always,
    expected_weights,
    optional_groups,
)

QKV = ("query", "key", "value")


def torch_to_keras(name, value):
    """A PyTorch tensor under `name` as keras_vit's array: dense `(out, in)` to `(in, out)`, a convolution to HWIO."""
    if value.ndim == 4 and name.endswith(".weight"):
        return value.transpose(2, 3, 1, 0)
    return value.T if name.endswith(".weight") and value.ndim == 2 else value


def file_shape(name, shape):
    """The shape the file's tensor `name` has where keras_vit's array has `shape` (`keras_to_torch` of a shape).

    Example:
    >>> file_shape("blocks.0.mlp.fc1.weight", (24, 48)), file_shape("Transformer/encoder_norm/scale", (24,))
    ((48, 24), (24,))
    """
    shape = tuple(int(side) for side in shape)
    if len(shape) == 4 and name.endswith(".weight"):
        return tuple(shape[axis] for axis in (3, 2, 0, 1))
    return shape[::-1] if len(shape) == 2 and name.endswith(".weight") else shape


def keras_to_torch(name, value):
    """The inverse of `torch_to_keras`."""
    if value.ndim == 4 and name.endswith(".weight"):
        return value.transpose(3, 2, 0, 1)
    return value.T if name.endswith(".weight") and value.ndim == 2 else value


@dataclasses.dataclass(frozen=True, eq=False)  # each rule is itself (hashed by identity)
class BlockRule:
    """Block tensors a file keeps otherwise than one per keras_vit weight (one tensor for two weights, two for one).

    Attributes:
        names: the file's names (after a block's prefix) -> the keras_vit
            paths (after `encoderblock_{i}/`) each feeds.
        read: `(parts, block)` -> `{path: array}` in keras_vit's layout, from
            `parts` (`{name: array}` in the file's layout, all of `names`)
            and `block` (all that block's tensors, for a size to split by).
        write: `{path: array}` (keras_vit's) -> `{name: array}` (the file's).
        when: the architectures whose files hold these names.
        needs: other names of the block that `read` takes a size from.
        shapes: `width` (the model's) -> `{name: shape}` (keras_vit's
            layout), each checked before `read` (None: none checked).
    """

    names: dict
    read: object
    write: object
    when: object = always
    needs: tuple = ()
    shapes: object = None


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    """One weight layout: which tensor of a file is which keras_vit weight.

    Attributes:
        name: the layout, as errors name it ("timm's VisionTransformer layout").
        top: file name -> keras_vit weight path, outside the blocks.
        block_prefix: what precedes a block's index in the file ("blocks.").
        block: name after `block_prefix` and the index -> keras_vit path
            after `encoderblock_{i}/`. A path may come as `(path, when)`:
            the file's name for it only where `when(architecture)` holds
            (DINOv2's `fc1` or, with SwiGLU, `weights_in`).
        strip: prefixes removed from the file's names first ("vit.").
        ignored: names (after `strip`) that hold nothing the model
            computes with: a mask token, an index buffer.
        other_model: prefixes of tensors of another model in the same
            file (a text tower), left aside.
        qkv: block name -> `(query|key|value, weight|bias)` where the file
            keeps the projections apart; they are fused into one kernel.
        packed: block name -> `(path, part, parts)`: the file keeps one
            keras_vit weight in `parts` pieces along its output axis (timm's
            unpacked SwiGLU, `fc1_g` then `fc1_x`), joined in `part` order.
            A file holds either these pieces or the `block` name of the
            same weight.
        reshaped: file name -> `(function(value) -> {path: array}, paths)`
            for tensors stored another way than keras_vit's.
        rules: `BlockRule`s for block tensors stored another way.
        grouped: the key and value projections of `qkv` may be narrower
            than the queries (grouped-query attention): the reader checks
            their widths against its config's key/value heads.
        hint: appended to the error for names the table does not know.
    """

    name: str
    top: dict
    block_prefix: str
    block: dict
    strip: tuple = ()
    ignored: tuple = ()
    other_model: tuple = ()
    qkv: dict = dataclasses.field(default_factory=dict)
    packed: dict = dataclasses.field(default_factory=dict)
    rules: tuple = ()
    reshaped: dict = dataclasses.field(default_factory=dict)
    grouped: bool = False
    hint: str = ""

    def own_name(self, name):
        """A file's tensor `name` with `strip` removed, or None for a tensor of `other_model`."""
        if name.startswith(self.other_model):
            return None
        prefix = next((prefix for prefix in self.strip if name.startswith(prefix)), "")
        return name[len(prefix):]

    def own_names(self, names):
        """The file's `names` of this model, with `strip` removed."""
        return [own for own in map(self.own_name, names) if own is not None]

    def block_part(self, name):
        """`(index, rest)` of a block tensor's name, or `(None, None)`."""
        if not name.startswith(self.block_prefix):
            return None, None
        index, _, rest = name[len(self.block_prefix):].partition(".")
        return (int(index), rest) if index.isdigit() and rest else (None, None)

    def _place(self, name):
        """Where the file's tensor `name` (after `strip`) goes: `(kind, index, rest)`, kind one of "reshaped",
        "top", "block", "qkv", "rule", "packed", or None for a name the table does not know."""
        index, rest = self.block_part(name)
        if name in self.reshaped:
            return "reshaped", None, name
        if name in self.top:
            return "top", None, name
        for kind, table in (("block", self.block), ("qkv", self.qkv),
                            ("rule", {name for rule in self.rules for name in rule.names}), ("packed", self.packed)):
            if rest in table:
                return kind, index, rest
        return None, index, rest

    def read(self, tensors, description, expected=None):
        """keras_vit's state `{path: array}` from a state dict of numpy arrays in this layout.

        `expected`: `(architecture, depth, settings)` of the model a config describes, whose tensors the file
        must hold exactly (`check_complete`).
        """
        state, qkv, packed, ruled, unknown = {}, {}, {}, {}, []
        rules = {name: rule for rule in self.rules for name in rule.names}
        own = {original: name for original, name in zip(tensors, map(self.own_name, tensors))
               if name is not None and name not in self.ignored}
        refuse_non_float(description, {original: np.asarray(tensors[original]).dtype for original in own})
        for original, name in own.items():
            value = np.asarray(tensors[original])
            kind, index, rest = self._place(name)
            if kind == "reshaped":
                state.update(self.reshaped[name][0](value))
            elif kind == "top":
                state[_path(self.top[name])] = torch_to_keras(name, value)
            elif kind == "block":
                state[f"encoderblock_{index}/{_path(self.block[rest])}"] = torch_to_keras(rest, value)
            elif kind == "qkv":
                qkv.setdefault(index, {})[self.qkv[rest]] = (original, torch_to_keras(rest, value))
            elif kind == "rule":
                ruled.setdefault((index, rules[rest]), {})[rest] = value
            elif kind == "packed":
                path, part, _ = self.packed[rest]
                packed.setdefault(f"encoderblock_{index}/{path}", {})[part] = (original, torch_to_keras(rest, value))
            else:
                unknown.append(original)
        if unknown:
            raise CheckpointError(f"{description} has {len(unknown)} tensors that are not in {self.name}: "
                                  f"{preview(unknown, 5)}{self.hint}.")
        self._check_heads(state, description)
        if expected:
            self.check_complete(list(tensors), *expected, description)
        kernel = state.get("embedding/kernel")
        width = None if kernel is None else int(kernel.shape[-1])
        fuse_qkv(qkv, state, description, width, self.grouped)
        self._join_packed(packed, state, description)
        self._apply_rules(ruled, tensors, state, description, width)
        return state

    def origins(self, names):
        """`{keras_vit path: the file's name}` for the file's tensor `names` in this layout, so that errors name
        the file's tensors: a name where one tensor is one weight (in PyTorch's shape, `file_shape`), a tuple of
        names where several make one (q, k and v; packed pieces; `rules`) or one is reshaped."""
        found = {}
        for original in names:
            name = self.own_name(original)
            if name is None or name in self.ignored:
                continue
            kind, index, rest = self._place(name)
            block = f"encoderblock_{index}/"
            if kind == "top":
                found[_path(self.top[name])] = original
            elif kind == "block":
                found[block + _path(self.block[rest])] = original
            else:
                paths = {"reshaped": lambda: self.reshaped[name][1],
                         "qkv": lambda: (f"{block}qkv/{'kernel' if self.qkv[rest][1] == 'weight' else 'bias'}",),
                         "packed": lambda: (block + self.packed[rest][0],),
                         "rule": lambda: [block + path for rule in self.rules for path in rule.names.get(rest, ())],
                         }.get(kind, tuple)()
                for path in paths:
                    found[path] = (*found.get(path, ()), original)
        return found

    def _check_heads(self, state, description):
        """Refuse a distilled file (with a distillation token) that holds one of its two heads and not the other."""
        if "distillation_token/dist" not in state:
            return
        held = [path for path in optional_groups(True)[0] if path in state]
        if held and len(held) < len(optional_groups(True)[0]):
            missing = [name for path in optional_groups(True)[0] if path not in state for name in self.file_names(path)]
            raise CheckpointError(f"{description} is a distilled DeiT ({self.file_names('distillation_token/dist')[0]}) "
                                  f"that lacks {' and '.join(missing)}: its class and distillation heads come together "
                                  "(both, or neither for a model without its top). Nothing was loaded.")

    def _apply_rules(self, ruled, tensors, state, description, width=None):
        for (index, rule), parts in sorted(ruled.items(), key=lambda item: item[0][0]):
            prefix = f"{self.block_prefix}{index}."
            missing = [prefix + name for name in (*rule.names, *rule.needs)
                       if name not in parts and prefix + name not in tensors]
            if missing:
                raise CheckpointError(f"{description} holds {preview([prefix + name for name in parts], 3)} but not "
                                      f"{preview(missing, 3)}, which come together. Nothing was loaded.")
            if rule.shapes is not None and width is not None:
                for name, shape in rule.shapes(width).items():
                    check_shape(description, prefix + name, torch_to_keras(name, parts[name]).shape, shape,
                                f"a model {width} wide")
            block = {name[len(prefix):]: np.asarray(value) for name, value in tensors.items()
                     if name.startswith(prefix)}
            state.update({f"encoderblock_{index}/{path}": value for path, value in rule.read(parts, block).items()})

    def _join_packed(self, packed, state, description):
        for path, parts in packed.items():
            rest = path.partition("/")[2]
            pieces = {part: name for name, (ours, part, _) in self.packed.items() if ours == rest}
            missing = [name for part, name in sorted(pieces.items()) if part not in parts]
            if missing:
                found = preview([original for original, _ in parts.values()], 3)
                raise CheckpointError(f"{description} holds {found} but not its other part "
                                      f"{self.block_prefix}{path.partition('/')[0].removeprefix('encoderblock_')}."
                                      f"{missing[0]}: the pieces of one weight come together. Nothing was loaded.")
            state[path] = np.concatenate([parts[part][1] for part in sorted(parts)], -1)

    def file_names(self, path, architecture=None, present=()):
        """The file's names (after `strip`) of keras_vit's weight `path` (for `architecture`, where the layout
        names it by the architecture): one, the three of a split q/k/v, or the `packed` pieces where any of
        them is among the file's names `present`."""
        def named(table, ours):
            return [name for name, value in table.items() if _path(value) == ours
                    and (architecture is None or not isinstance(value, tuple) or value[1](architecture))]

        block, _, rest = path.partition("/")
        if block.startswith("encoderblock_") and block[len("encoderblock_"):].isdigit():
            prefix = f"{self.block_prefix}{block[len('encoderblock_'):]}."
            field = {"qkv/kernel": "weight", "qkv/bias": "bias"}.get(rest)
            names = named(self.block, rest) + [name for name, (_, kind) in self.qkv.items() if kind == field]
            pieces = [prefix + name for name, (ours, _, _) in self.packed.items() if ours == rest]
            if pieces and set(pieces) & set(present):
                return pieces
            names += [name for rule in self.rules for name, paths in rule.names.items()
                      if rest in paths and (architecture is None or rule.when(architecture))]
            return [prefix + name for name in names]
        return named(self.top, path) + [name for name, (_, paths) in self.reshaped.items() if path in paths]

    def check_complete(self, names, architecture, depth, settings, description, supplied=()):
        """Refuse a file whose tensor `names` are not exactly those of the model `architecture` describes.

        `settings`: the config fields that decide the tensors (`"key: value, ..."`), for the errors. The
        classifier and the pre-logits (`model_weights.OPTIONAL_GROUPS`) may be there or not, each whole. `supplied`:
        keras_vit weights that other tensors than this layout's give (a hybrid stem's patch convolution).
        """
        own = set(self.own_names(names)) - set(self.ignored)
        wanted = set()
        for path in expected_weights(architecture, depth) - set(supplied):
            wanted.update(self.file_names(path, architecture, own))
        for group in optional_groups(architecture.distillation_token):
            files = {name for path in group for name in self.file_names(path)}
            if own & files:
                wanted |= files
        under = f" (names after {self.strip[0]!r})" if self.strip and any(
            name.startswith(self.strip[0]) for name in names) else ""
        missing = wanted - own
        if missing:
            raise CheckpointError(f"{description} lacks {len(missing)} tensors of the model its config.json "
                                  f"describes ({settings}): {preview(missing, 5)}{under}.")
        extra = own - wanted
        if extra:
            raise CheckpointError(f"{description} has {len(extra)} tensors that the model its config.json "
                                  f"describes ({settings}) has not: {preview(extra, 5)}{under}.")

    def write(self, state, unpacked=False, architecture=None):
        """A state dict in this layout (PyTorch's shapes) from keras_vit's `state`; a weight with no place is refused.

        `unpacked`: write the weights that `packed` declares in their pieces.
        `architecture`: the model's, for the names and `rules` that depend on it.
        """
        def applies(entry):
            return architecture is None or not isinstance(entry, tuple) or entry[1](architecture)

        tops = {_path(ours): name for name, ours in self.top.items()}
        blocks = {}
        for name, ours in self.block.items():  # without an architecture, the first name of a weight
            if applies(ours):
                blocks.setdefault(_path(ours), name)
        rules = [rule for rule in self.rules if architecture is not None and rule.when(architecture)]
        ruled = {path for rule in rules for paths in rule.names.values() for path in paths}
        blocks = {path: name for path, name in blocks.items() if path not in ruled}
        state = dict(state)
        tensors = {}
        for block in sorted({path.partition("/")[0] for path in state if path.startswith("encoderblock_")}):
            prefix = f"{self.block_prefix}{block.removeprefix('encoderblock_')}."
            for rule in rules:
                paths = {path for paths in rule.names.values() for path in paths}
                parts = {path: state.pop(f"{block}/{path}") for path in paths if f"{block}/{path}" in state}
                if parts:
                    tensors.update({prefix + name: np.require(value, "float32", "C")  # a scalar stays 0-d
                                    for name, value in rule.write(parts).items()})
        pieces = {}
        for name, (ours, part, parts) in self.packed.items():
            pieces.setdefault(ours, []).append((part, parts, name))
        for path, value in state.items():
            block, _, rest = path.partition("/")
            if block.startswith("encoderblock_") and unpacked and rest in pieces:
                prefix = f"{self.block_prefix}{block.removeprefix('encoderblock_')}."
                for part, parts, name in pieces[rest]:
                    piece = np.split(value, parts, axis=-1)[part]
                    tensors[prefix + name] = np.ascontiguousarray(keras_to_torch(name, piece).astype("float32"))
                continue
            if block.startswith("encoderblock_") and rest in blocks:
                name = f"{self.block_prefix}{block.removeprefix('encoderblock_')}.{blocks[rest]}"
            elif path in tops:
                name = tops[path]
            else:
                raise CheckpointError(f"the model's weight {path!r} has no place in {self.name}.")
            tensors[name] = np.ascontiguousarray(keras_to_torch(name, value).astype("float32"))
        return tensors


def _path(value):
    """The keras_vit path of a table entry: the entry, or the path of a `(path, when)` pair."""
    return value[0] if isinstance(value, tuple) else value


def fuse_qkv(qkv, state, description, width=None, grouped=False):
    """Put the `{block: {(query|key|value, weight|bias): (file name, array)}}` projections into `state` as fused `qkv`.

    A block has biases for all three projections or for none. Each tensor is
    checked against its own shape before they are fused, in the file's names
    and shapes: the query is `width` x `width` (`width`: the model's, else the
    query's input), the key and value the same or, with grouped-query attention
    (`grouped`), as narrow as the reader checks, and each bias as wide as its
    weight. Their sum alone would let a key one head wider and a value one
    head narrower through.
    """
    for index, parts in qkv.items():
        biases = [(kind, "bias") in parts for kind in QKV]
        missing = [f"{kind}.weight" for kind in QKV if (kind, "weight") not in parts]
        missing += [f"{kind}.bias" for kind, bias in zip(QKV, biases) if any(biases) and not bias]
        if missing:
            raise CheckpointError(f"{description}: block {index} lacks attention {missing}.")
        query = parts[("query", "weight")][1]
        width_in = width or int(query.shape[0] if query.ndim else 0)
        for kind in QKV:
            name, kernel = parts[(kind, "weight")]
            out = int(kernel.shape[-1]) if grouped and kind != "query" and kernel.ndim == 2 else width_in
            check_shape(description, name, kernel.shape, (width_in, out), f"a model {width_in} wide")
            if (kind, "bias") in parts:
                name, bias = parts[(kind, "bias")]
                check_shape(description, name, bias.shape, (out,), f"a model {width_in} wide")
        state[f"encoderblock_{index}/qkv/kernel"] = np.concatenate([parts[(kind, "weight")][1] for kind in QKV], -1)
        if any(biases):
            state[f"encoderblock_{index}/qkv/bias"] = np.concatenate([parts[(kind, "bias")][1] for kind in QKV])


def check_shape(description, name, shape, expected, model):
    """Refuse the file's tensor `name` whose keras_vit array has `shape` where `model` ("a model 24 wide") has
    `expected`, in one line naming the file (`description`), the tensor and both shapes as the file keeps them."""
    if tuple(int(side) for side in shape) != tuple(expected):
        raise CheckpointError(f"{description}: '{name}' has shape {file_shape(name, shape)}, but {model} expects "
                              f"{file_shape(name, expected)}. Nothing was loaded.")


def settings(fields, *keys):
    """`"key: value, ..."` (JSON values): the config fields that decide which tensors a model has, for the errors."""
    return ", ".join(f"{key}: {json.dumps(fields[key])}" for key in keys)
