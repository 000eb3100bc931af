"""Typed Sapiens2 configs parsed from a transformers-style config.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapiens2.errors import CheckpointNotFoundError, ConfigError
from sapiens2.models.layers import ACTIVATIONS


def _pair(name: str, value: Any) -> tuple[int, int]:
    """An int or a [height, width] pair as a (height, width) tuple of positive ints."""
    items = [value, value] if isinstance(value, int) else value
    if (
        not isinstance(items, (list, tuple))
        or len(items) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items)
    ):
        raise ConfigError(f"{name}: expected a positive int or a [height, width] pair, got {value!r}")
    return int(items[0]), int(items[1])


def _int_list(name: str, value: Any, *, allow_none: bool = True) -> list[int] | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    ):
        raise ConfigError(f"{name}: expected a list of positive ints, got {value!r}")
    return [int(v) for v in value]


def _branch(
    d: Mapping[str, Any], branch: str, default_kernel: int
) -> tuple[list[int] | None, list[int] | None]:
    """Out channels and kernel sizes of one head branch; kernels default to `<branch>_kernel_size` each."""
    name = f"head_config.{branch}_kernel_sizes"
    channels = _int_list(f"head_config.{branch}_out_channels", d.get(f"{branch}_out_channels"))
    sizes = d.get(f"{branch}_kernel_sizes")
    if channels is None:
        return None, _int_list(name, sizes)
    if sizes is None:
        sizes = [d.get(f"{branch}_kernel_size", default_kernel)] * len(channels)
    sizes = _int_list(name, sizes, allow_none=False)
    if len(sizes) != len(channels):
        raise ConfigError(f"{name}: {sizes!r} must have one entry per output channel count ({len(channels)})")
    return channels, sizes


# Padding and output padding of a stride-2 transposed conv for each kernel size the official deconv heads
# accept: each gives exactly twice the input size.
DECONV_PADDING: dict[int, tuple[int, int]] = {2: (0, 0), 3: (1, 1), 4: (1, 0)}


@dataclass
class HeadConfig:
    """Decode-head layout: upsampling blocks, refinement convs and the optional pointmap scale branch."""

    upsample_out_channels: list[int] | None = None
    upsample_kernel_sizes: list[int] | None = None
    use_pixel_shuffle: bool = False
    conv_out_channels: list[int] | None = None
    conv_kernel_sizes: list[int] | None = None
    scale_conv_out_channels: list[int] | None = None
    scale_conv_kernel_sizes: list[int] | None = None
    scale_final_input_size: int | None = None
    scale_final_hidden_sizes: list[int] | None = None

    @property
    def has_scale_branch(self) -> bool:
        """Whether the head also regresses the pointmap focal-length scale."""
        return self.scale_conv_out_channels is not None

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], image_size: tuple[int, int], token_size: tuple[int, int]
    ) -> HeadConfig:
        """Parse a `head_config` dict, filling kernel sizes and the scale input size as transformers does
        (`token_size`: pixels per backbone token)."""
        prefix = "head_config."
        up, up_kernels = _branch(d, "upsample", 4)
        conv, conv_kernels = _branch(d, "conv", 1)
        scale, scale_kernels = _branch(d, "scale_conv", 1)
        hidden = _int_list(prefix + "scale_final_hidden_sizes", d.get("scale_final_hidden_sizes"))
        if scale is not None and (hidden is None or len(hidden) != 2):
            raise ConfigError(
                f"{prefix}scale_final_hidden_sizes: the scale branch needs two hidden sizes, got {hidden!r}"
            )
        final_input = d.get("scale_final_input_size")
        if final_input is None and scale is not None:
            final_input = _scale_input_size(scale, scale_kernels, image_size, token_size)
        if final_input is not None and (not isinstance(final_input, int) or final_input <= 0):
            raise ConfigError(f"{prefix}scale_final_input_size: expected a positive int, got {final_input!r}")
        pixel_shuffle = d.get("use_pixel_shuffle")
        if pixel_shuffle is not None and not isinstance(pixel_shuffle, bool):
            raise ConfigError(f"{prefix}use_pixel_shuffle: expected a bool or null, got {pixel_shuffle!r}")
        unsupported = [k for k in up_kernels or [] if k not in DECONV_PADDING]
        if not pixel_shuffle and unsupported:
            raise ConfigError(
                f"{prefix}upsample_kernel_sizes: {up_kernels!r}; a transposed-conv head doubles the size "
                f"with kernels of {', '.join(map(str, DECONV_PADDING))} only, as the official heads do"
            )
        return cls(
            upsample_out_channels=up,
            upsample_kernel_sizes=up_kernels,
            use_pixel_shuffle=bool(pixel_shuffle),
            conv_out_channels=conv,
            conv_kernel_sizes=conv_kernels,
            scale_conv_out_channels=scale,
            scale_conv_kernel_sizes=scale_kernels,
            scale_final_input_size=final_input,
            scale_final_hidden_sizes=hidden,
        )


def _scale_input_size(
    channels: list[int], kernels: list[int], image_size: tuple[int, int], token_size: tuple[int, int]
) -> int:
    """Flattened size after the stride-2 scale convs applied to the token grid of `image_size`."""
    height, width = image_size[0] // token_size[0], image_size[1] // token_size[1]
    for kernel in kernels:
        padding = (kernel - 1) // 2
        height = (height + 2 * padding - kernel) // 2 + 1
        width = (width + 2 * padding - kernel) // 2 + 1
    return height * width * channels[-1]


@dataclass
class Sapiens2Config:
    """Hyper-parameters of a Sapiens2 backbone and, for task models, of its decode head."""

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads_per_layer: list[int] = field(default_factory=list)
    rope_theta: float = 100.0
    num_register_tokens: int = 8
    use_qk_norm: bool = True
    use_gated_mlp: bool = True
    query_bias: bool = True
    key_bias: bool = True
    value_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    rms_norm_eps: float = 1e-6
    patch_size: tuple[int, int] = (16, 16)
    image_size: tuple[int, int] = (224, 224)
    # The 4K backbone's hierarchical tokenizer: each window_size x window_size block of patch tokens becomes
    # one token after num_tokenizer_layers transformer blocks run within the block.
    use_tokenizer: bool = False
    window_size: int = 4
    num_tokenizer_layers: int = 0
    hidden_act: str = "silu"
    num_channels: int = 3
    id2label: dict[int, str] = field(default_factory=lambda: {0: "LABEL_0", 1: "LABEL_1"})
    flip_pairs: list[tuple[int, int]] | None = None
    semantic_loss_ignore_index: int = 255
    # A fine-tuned model's keypoint links (0-based) and class colours, written by `sapiens2 train`.
    skeleton: list[tuple[int, int]] | None = None
    palette: list[tuple[int, int, int]] | None = None
    # Training-mode RoPE coordinate augmentation (transformers' defaults).
    pos_embed_shift: float | None = None
    pos_embed_jitter: float | None = None
    pos_embed_rescale: float | None = 2.0
    normalize_backbone_outputs: bool = True
    reshape_hidden_states: bool = True
    return_class_token: bool = False
    out_indices: list[int] = field(default_factory=list)
    head_config: HeadConfig | None = None
    architectures: list[str] = field(default_factory=list)
    dtype: str | None = None

    @property
    def num_labels(self) -> int:
        """Number of output channels of the decode head (keypoints, classes, ...)."""
        return len(self.id2label)

    def label_names(self) -> tuple[str, ...]:
        """The id2label names in index order, "" where a name is absent: empty, or the placeholder
        `LABEL_<index>` that transformers writes for a bare `num_labels`."""
        names = (self.id2label.get(index, "") for index in range(self.num_labels))
        return tuple("" if name == f"LABEL_{index}" else name for index, name in enumerate(names))

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def token_size(self) -> tuple[int, int]:
        """Pixels per token: the patch size, times the tokenizer window when there is a tokenizer."""
        scale = self.window_size if self.use_tokenizer else 1
        return self.patch_size[0] * scale, self.patch_size[1] * scale

    def token_grid(self, input_size: tuple[int, int]) -> tuple[int, int]:
        """(rows, columns) of patch tokens the transformer blocks see for an input of `input_size`."""
        return input_size[0] // self.token_size[0], input_size[1] // self.token_size[1]

    def head_output_size(self, input_size: tuple[int, int]) -> tuple[int, int]:
        """(height, width) of the decode head's maps for an input of `input_size`: the token grid doubled by
        each upsampling block."""
        rows, columns = self.token_grid(input_size)
        scale = 2 ** len(self.head_config.upsample_out_channels or []) if self.head_config else 1
        return rows * scale, columns * scale

    @property
    def architecture(self) -> str:
        """The model class name this config was saved for."""
        return self.architectures[0]

    def accepts_input_size(self, size: tuple[int, int]) -> bool:
        """Whether inputs of `size` (height, width) fit the model: any size does, except for a pointmap scale
        branch, whose dense layer takes the flattened map of the patch grid of `image_size` only."""
        head = self.head_config
        if head is None or not head.has_scale_branch:
            return True
        channels, kernels = head.scale_conv_out_channels, head.scale_conv_kernel_sizes
        return _scale_input_size(channels, kernels, size, self.patch_size) == head.scale_final_input_size

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sapiens2Config:
        """Parse and validate a transformers-style config dict.

        Training-only fields (dropout, drop path, init ranges, mask token) and unknown keys are ignored; a
        supported field with a value this package cannot run raises ConfigError.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"config: expected a JSON object, got {type(d).__name__}")
        defaults = cls()
        get = d.get
        layers = _positive_int(d, "num_hidden_layers", defaults.num_hidden_layers)
        heads = _positive_int(d, "num_attention_heads", defaults.num_attention_heads)
        hidden = _positive_int(d, "hidden_size", defaults.hidden_size)
        if hidden % heads or (hidden // heads) % 4:
            raise ConfigError(
                f"hidden_size: {hidden} must split into {heads} heads whose size is a multiple of 4 "
                "(2D rotary embedding)"
            )
        patch_size = _pair("patch_size", get("patch_size", 16))
        image_size = _pair("image_size", get("image_size", 224))
        head = get("head_config")
        if head is not None and not isinstance(head, Mapping):
            raise ConfigError(f"head_config: expected an object or null, got {head!r}")
        use_tokenizer, window, tokenizer_layers = _tokenizer(d)
        token_size = (patch_size[0] * window, patch_size[1] * window) if use_tokenizer else patch_size
        config = cls(
            hidden_size=hidden,
            intermediate_size=_positive_int(d, "intermediate_size", defaults.intermediate_size),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads_per_layer=_kv_heads(d, layers, heads),
            rope_theta=_number(d, "rope_theta", defaults.rope_theta),
            num_register_tokens=_count(d, "num_register_tokens", defaults.num_register_tokens),
            use_qk_norm=_flag(d, "use_qk_norm", defaults.use_qk_norm),
            use_gated_mlp=_flag(d, "use_gated_mlp", defaults.use_gated_mlp),
            query_bias=_flag(d, "query_bias", True),
            key_bias=_flag(d, "key_bias", True),
            value_bias=_flag(d, "value_bias", True),
            proj_bias=_flag(d, "proj_bias", True),
            mlp_bias=_flag(d, "mlp_bias", True),
            rms_norm_eps=_number(d, "rms_norm_eps", defaults.rms_norm_eps),
            patch_size=patch_size,
            image_size=image_size,
            use_tokenizer=use_tokenizer,
            window_size=window,
            num_tokenizer_layers=tokenizer_layers,
            hidden_act=get("hidden_act", defaults.hidden_act),
            num_channels=_positive_int(d, "num_channels", defaults.num_channels),
            id2label=_id2label(d),
            flip_pairs=_flip_pairs(get("flip_pairs")),
            semantic_loss_ignore_index=_integer(d, "semantic_loss_ignore_index", 255),
            skeleton=_index_pairs("skeleton", get("skeleton")),
            palette=_palette(get("palette")),
            pos_embed_shift=_optional_number(d, "pos_embed_shift", None),
            pos_embed_jitter=_optional_number(d, "pos_embed_jitter", None),
            pos_embed_rescale=_optional_number(d, "pos_embed_rescale", 2.0),
            normalize_backbone_outputs=_flag(d, "normalize_backbone_outputs", True),
            reshape_hidden_states=_flag(d, "reshape_hidden_states", True),
            return_class_token=_flag(d, "return_class_token", False),
            out_indices=_out_indices(d, layers),
            head_config=None if head is None else HeadConfig.from_dict(head, image_size, token_size),
            architectures=list(get("architectures") or ["Sapiens2Model"]),
            dtype=get("dtype", get("torch_dtype")),
        )
        config._check_supported()
        return config

    def _check_supported(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            supported = sorted(ACTIVATIONS)
            raise ConfigError(f"hidden_act: {self.hidden_act!r} is not supported (supported: {supported})")
        if not self.use_gated_mlp:
            raise ConfigError("use_gated_mlp: False is not supported (every Sapiens2 checkpoint uses SwiGLU)")
        if self.dtype is not None and not isinstance(self.dtype, str):
            raise ConfigError(f"dtype: expected a string such as 'float32', got {self.dtype!r}")


def _positive_int(d: Mapping[str, Any], name: str, default: int) -> int:
    value = d.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}: expected a positive int, got {value!r}")
    return value


def _number(d: Mapping[str, Any], name: str, default: float) -> float:
    value = d.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def _count(d: Mapping[str, Any], name: str, default: int) -> int:
    value = d.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}: expected a non-negative int, got {value!r}")
    return value


def _optional_number(d: Mapping[str, Any], name: str, default: float | None) -> float | None:
    value = d.get(name, default)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}: expected a positive number or null, got {value!r}")
    return float(value)


def _integer(d: Mapping[str, Any], name: str, default: int) -> int:
    value = d.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected an int, got {value!r}")
    return value


def _flag(d: Mapping[str, Any], name: str, default: bool) -> bool:
    value = d.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    return value


def _tokenizer(d: Mapping[str, Any]) -> tuple[bool, int, int]:
    """use_tokenizer, window_size and num_tokenizer_layers; the layer count has no default (it depends on
    the backbone size: 4 for the official 1b-4k)."""
    if not _flag(d, "use_tokenizer", False):
        return False, 4, 0
    window = _positive_int(d, "window_size", 4)
    if d.get("num_tokenizer_layers") is None:
        raise ConfigError("num_tokenizer_layers: required with use_tokenizer=true (the official 1b-4k has 4)")
    return True, window, _positive_int(d, "num_tokenizer_layers", 0)


def _kv_heads(d: Mapping[str, Any], layers: int, heads: int) -> list[int]:
    """Key/value heads of every layer: given per layer, or full attention at both ends and GQA between."""
    per_layer = d.get("num_key_value_heads_per_layer")
    if per_layer is None:
        first = _count(d, "num_first_full_attention_layers", 8)
        last = _count(d, "num_last_full_attention_layers", 8)
        grouped = _positive_int(d, "num_key_value_attention_heads", 8)
        per_layer = [heads if i < first or i >= layers - last else grouped for i in range(layers)]
        name = "num_key_value_attention_heads"
    else:
        name = "num_key_value_heads_per_layer"
        per_layer = _int_list(name, per_layer, allow_none=False)
        if len(per_layer) != layers:
            raise ConfigError(f"{name}: {per_layer!r} must have num_hidden_layers={layers} entries")
    if any(heads % kv for kv in per_layer):
        raise ConfigError(f"{name}: {per_layer!r} has key/value head counts not dividing {heads} heads")
    return per_layer


def _id2label(d: Mapping[str, Any]) -> dict[int, str]:
    labels = d.get("id2label")
    if labels is None:
        count = _positive_int(d, "num_labels", 2)
        return {i: f"LABEL_{i}" for i in range(count)}
    if not isinstance(labels, Mapping):
        raise ConfigError(f"id2label: expected an object mapping indices to names, got {labels!r}")
    try:
        parsed = {int(k): str(v) for k, v in labels.items()}
    except ValueError as error:
        raise ConfigError(f"id2label: keys must be integers, got {list(labels)!r}") from error
    if sorted(parsed) != list(range(len(parsed))):
        raise ConfigError(f"id2label: keys must be 0..{len(parsed) - 1}, got {sorted(parsed)!r}")
    return dict(sorted(parsed.items()))


def _flip_pairs(value: Any) -> list[tuple[int, int]] | None:
    return _index_pairs("flip_pairs", value)


def _index_pairs(name: str, value: Any) -> list[tuple[int, int]] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(i, int) and i >= 0 for i in p)
        for p in value
    ):
        raise ConfigError(f"{name}: expected a list of [first, second] index pairs, got {value!r}")
    return [(int(a), int(b)) for a, b in value]


def _palette(value: Any) -> list[tuple[int, int, int]] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(c, (list, tuple)) and len(c) == 3 and all(isinstance(v, int) and 0 <= v <= 255 for v in c)
        for c in value
    ):
        raise ConfigError(f"palette: expected a list of [r, g, b] colours (0..255), got {value!r}")
    return [(int(r), int(g), int(b)) for r, g, b in value]


def _out_indices(d: Mapping[str, Any], layers: int) -> list[int]:
    """Backbone stages to return (0 is the patch embedding, i the output of block i); default: the last."""
    indices = d.get("out_indices")
    if indices is None and d.get("out_features") is not None:
        names = ["stem"] + [f"stage{i}" for i in range(1, layers + 1)]
        features = d["out_features"]
        unknown = [f for f in features if f not in names]
        if unknown:
            raise ConfigError(f"out_features: unknown stage names {unknown!r} (stem, stage1..stage{layers})")
        indices = [names.index(f) for f in features]
    if indices is None:
        return [layers]
    if not isinstance(indices, (list, tuple)) or not all(
        isinstance(i, int) and -layers - 1 <= i <= layers for i in indices
    ):
        raise ConfigError(f"out_indices: expected stage indices in 0..{layers}, got {indices!r}")
    return [i % (layers + 1) for i in indices]


def load_config(path: str | Path) -> Sapiens2Config:
    """Read a config.json (or the config.json inside a directory) into a Sapiens2Config."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text()
    except FileNotFoundError as error:
        raise CheckpointNotFoundError(f"no config file at {path}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from error
    return Sapiens2Config.from_dict(data)
