"""What the ComfyUI double knows about graphs: the node classes it accepts (a host's own set: a
custom node is installed on some hosts only), validation with ComfyUI 0.3.64's error shapes
(`execution.validate_prompt`, recorded in tests/comfyui_transcripts/post_prompt_*.json), the
node classes as `GET /object_info` lists them, the order nodes run in, and the files each save
node writes, named as ComfyUI names them and listed as its history and `executed` list them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class NodeClass:
    required: tuple[str, ...] = ()
    output: Literal["images", "gifs"] | None = None  # key under history "outputs"
    extension: str = ""
    animated: bool = False  # ComfyUI adds "animated": [true] next to "images"
    temp: bool = False  # written to ComfyUI's temp folder (type "temp")
    progress: bool = False  # has a progress bar: sends `progress` messages while it runs
    # List inputs whose value must be one of these options (value_not_in_list otherwise), and
    # those whose options are the files of one of the host's model folders.
    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    model_lists: Mapping[str, str] = field(default_factory=dict)


_SAMPLER = ("model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative")
NODE_CLASSES: dict[str, NodeClass] = {
    "CheckpointLoaderSimple": NodeClass(("ckpt_name",), model_lists={"ckpt_name": "checkpoints"}),
    "CLIPTextEncode": NodeClass(("text", "clip")),
    "EmptyLatentImage": NodeClass(("width", "height", "batch_size")),
    "KSampler": NodeClass((*_SAMPLER, "latent_image", "denoise"), progress=True),
    "KSamplerAdvanced": NodeClass((*_SAMPLER, "latent_image", "noise_seed"), progress=True),
    "VAEDecode": NodeClass(("samples", "vae")),
    "EmptyImage": NodeClass(("width", "height", "batch_size", "color")),
    "ImageBlur": NodeClass(("image", "blur_radius", "sigma")),
    "ImageScale": NodeClass(("image", "upscale_method", "width", "height", "crop")),
    "CreateVideo": NodeClass(("images", "fps")),
    "SaveVideo": NodeClass(
        ("video", "filename_prefix", "format", "codec"), "images", "mp4", animated=True
    ),
    "SaveWEBM": NodeClass(
        ("images", "filename_prefix", "codec", "fps", "crf"), "images", "webm", animated=True
    ),
    "SaveAnimatedWEBP": NodeClass(
        ("images", "filename_prefix", "fps", "lossless", "quality", "method"),
        "images",
        "webp",
        animated=True,
    ),
    "SaveAnimatedPNG": NodeClass(
        ("images", "filename_prefix", "fps", "compress_level"), "images", "png", animated=True
    ),
    "SaveImage": NodeClass(("images", "filename_prefix"), "images", "png"),
    # Its `image` names a file in ComfyUI's input folder ("<subfolder>/<name>"), checked at POST.
    "LoadImage": NodeClass(("image",)),
    "PreviewImage": NodeClass(("images",), "images", "png", temp=True),
    # A custom node (tests/comfyui_transcripts/object_info_excerpt.json), installed on a host only
    # when its `nodes` name it.
    "FilmGrainLite": NodeClass(("images", "grain"), lists={"grain": ("fine", "coarse")}),
    # VideoHelperSuite's custom node: its videos come under "gifs", named without the trailing _.
    "VHS_VideoCombine": NodeClass(
        ("images", "frame_rate", "loop_count", "filename_prefix", "format", "pingpong"),
        "gifs",
        "mp4",
    ),
}


CUSTOM_NODES = frozenset({"FilmGrainLite"})  # on no host unless installed there
# The model folders a ComfyUI 0.3.64 knows (models_folders.json).
MODEL_FOLDERS = (
    "checkpoints", "configs", "loras", "vae", "text_encoders", "diffusion_models", "clip_vision",
    "style_models", "embeddings", "diffusers", "vae_approx", "controlnet", "gligen",
    "upscale_models", "custom_nodes", "hypernetworks", "photomaker", "classifiers",
    "model_patches", "audio_encoders",
)  # fmt: skip


@dataclass(frozen=True)
class Host:
    """What one ComfyUI has installed: its node classes and its model files per folder."""

    nodes: frozenset[str] = frozenset(NODE_CLASSES) - CUSTOM_NODES
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def options(self, cls: NodeClass, name: str) -> tuple[str, ...] | None:
        """The options of a list input of `cls`; None: not a list input."""
        if name in cls.lists:
            return cls.lists[name]
        if name in cls.model_lists:
            return self.models.get(cls.model_lists[name], ())
        return None

    def object_info(self, only: str | None = None) -> dict[str, Any]:
        """`GET /object_info` (or `/object_info/{only}`): each class as ComfyUI lists it, its
        list inputs in the legacy form `[[option, ...], {}]` (object_info_excerpt.json); the
        double knows no other input's type, so those say "*"."""
        listed = {}
        for name in sorted(self.nodes if only is None else self.nodes & {only}):
            cls = NODE_CLASSES[name]
            required = {
                i: [list(o), {}] if (o := self.options(cls, i)) is not None else ["*", {}]
                for i in cls.required
            }
            listed[name] = {
                "input": {"required": required},
                "input_order": {"required": list(cls.required)},
                "output": [],
                "output_is_list": [],
                "output_name": [],
                "name": name,
                "display_name": name,
                "description": "",
                "python_module": f"custom_nodes.{name}" if name in CUSTOM_NODES else "nodes",
                "category": "spillway-sim",
                "output_node": cls.output is not None,
            }
        return listed


def model_files(prompt: dict[str, Any]) -> frozenset[str]:
    """The model files a prompt's loaders name."""
    return frozenset(
        str(node["inputs"][name])
        for node in prompt.values()
        if isinstance(node, dict) and (cls := NODE_CLASSES.get(str(node.get("class_type"))))
        for name in cls.model_lists
        if isinstance(node.get("inputs"), dict) and name in node["inputs"]
    )


@dataclass(frozen=True)
class Validation:
    ok: bool
    error: dict[str, Any] | None
    outputs: list[str]
    node_errors: dict[str, Any]


def error_body(kind: str, message: str, details: str) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": {}}


def validate(
    prompt: dict[str, Any],
    input_exists: Callable[[str], bool] = lambda _: True,
    host: Host | None = None,
) -> Validation:
    """ComfyUI's validate_prompt: unknown classes (not installed on `host`) end validation at
    once with `invalid_prompt`; otherwise each output node is checked with everything upstream
    of it, and the prompt is accepted (200) if at least one output is good, with the bad ones in
    `node_errors`. `input_exists(name)`: whether ComfyUI's input folder has the file a LoadImage
    names."""
    host = host or Host()
    outputs = []
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            message = "Cannot execute because a node is missing the class_type property."
            return Validation(
                False, error_body("invalid_prompt", message, f"Node ID '#{node_id}'"), [], {}
            )
        cls = NODE_CLASSES.get(node["class_type"]) if node["class_type"] in host.nodes else None
        if cls is None:
            message = f"Cannot execute because node {node['class_type']} does not exist."
            return Validation(
                False, error_body("invalid_prompt", message, f"Node ID '#{node_id}'"), [], {}
            )
        if cls.output is not None:
            outputs.append(node_id)
    if not outputs:
        return Validation(
            False, error_body("prompt_no_outputs", "Prompt has no outputs", ""), [], {}
        )

    reasons_of: dict[str, list[dict[str, Any]]] = {}
    good: list[str] = []
    failed: list[str] = []
    node_errors: dict[str, Any] = {}
    for output in sorted(outputs):
        bad = [
            n
            for n in upstream(prompt, output)
            if _reasons(prompt, n, reasons_of, input_exists, host)
        ]
        if not bad:
            good.append(output)
            continue
        failed.append(output)
        for node_id in bad:
            entry = node_errors.setdefault(
                node_id,
                {
                    "errors": reasons_of[node_id],
                    "dependent_outputs": [],
                    "class_type": prompt[node_id]["class_type"],
                },
            )
            entry["dependent_outputs"].append(output)
    if not good:
        # Only the output nodes' own reasons: an output failing because of a node upstream
        # contributes nothing here (that node is named in node_errors).
        details = "\n".join(
            f"{r['message']}: {r['details']}" for output in failed for r in reasons_of[output]
        )
        error = error_body(
            "prompt_outputs_failed_validation", "Prompt outputs failed validation", details
        )
        return Validation(False, error, [], node_errors)
    return Validation(True, None, good, node_errors)


def _reasons(
    prompt: dict[str, Any],
    node_id: str,
    cache: dict[str, list[dict[str, Any]]],
    input_exists: Callable[[str], bool],
    host: Host,
) -> list[dict[str, Any]]:
    if node_id not in cache:
        node = prompt[node_id]
        inputs = node.get("inputs") or {}
        cls = NODE_CLASSES[node["class_type"]]
        cache[node_id] = [
            {
                "type": "required_input_missing",
                "message": "Required input is missing",
                "details": name,
                "extra_info": {"input_name": name},
            }
            for name in cls.required
            if name not in inputs
        ]
        for name, value in inputs.items():
            options = host.options(cls, name)
            if options is not None and not _is_link(value) and value not in options:
                # post_prompt_value_not_in_list.json
                cache[node_id].append(
                    {
                        "type": "value_not_in_list",
                        "message": "Value not in list",
                        "details": f"{name}: {value!r} not in {list(options)!r}",
                        "extra_info": {
                            "input_name": name,
                            "input_config": [list(options), {}],
                            "received_value": value,
                        },
                    }
                )
        image = inputs.get("image")
        # A missing file fails at POST time (post_prompt_loadimage_missing_file.json).
        if node["class_type"] == "LoadImage" and isinstance(image, str) and not input_exists(image):
            cache[node_id].append(
                {
                    "type": "custom_validation_failed",
                    "message": "Custom validation failed for node",
                    "details": f"image - Invalid image file: {image}",
                    "extra_info": {"input_name": "image"},
                }
            )
    return cache[node_id]


def upstream(prompt: dict[str, Any], node_id: str) -> list[str]:
    """`node_id` and every node it depends on, dependencies first (the order ComfyUI runs them)."""
    order: list[str] = []

    def visit(current: str) -> None:
        if current in order or current not in prompt:
            return
        for value in (prompt[current].get("inputs") or {}).values():
            if _is_link(value):
                visit(str(value[0]))
        order.append(current)

    visit(node_id)
    return order


def execution_order(prompt: dict[str, Any], outputs: list[str]) -> list[str]:
    order: list[str] = []
    for output in outputs:
        order += [n for n in upstream(prompt, output) if n not in order]
    return order


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)


def batch_size(prompt: dict[str, Any], node_id: str) -> int:
    """The batch size of the first upstream node that sets one (SaveImage writes one file per
    image of the batch)."""
    for current in reversed(upstream(prompt, node_id)):
        size = (prompt[current].get("inputs") or {}).get("batch_size")
        if isinstance(size, int) and size > 0:
            return size
    return 1


def output_files(
    prompt: dict[str, Any], node_id: str, counters: dict[tuple[str, str], int]
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The node's UI output (as in `executed` and history) and its files as (type, subfolder,
    filename). Counters continue per folder and prefix, as ComfyUI's scan of its output folder."""
    node = prompt[node_id]
    cls = NODE_CLASSES[node["class_type"]]
    inputs = node.get("inputs") or {}
    kind = "temp" if cls.temp or inputs.get("save_output") is False else "output"
    prefix = "ComfyUI_temp_simul" if cls.temp else str(inputs.get("filename_prefix", "ComfyUI"))
    subfolder, base = posixpath.split(prefix)
    extension = _extension(cls, inputs)
    count = (
        batch_size(prompt, node_id) if node["class_type"] in ("SaveImage", "PreviewImage") else 1
    )
    entries, files = [], []
    for _ in range(count):
        counters[(subfolder, base)] = counter = counters.get((subfolder, base), 0) + 1
        if cls.output == "gifs":
            filename = f"{base}_{counter:05}.{extension}"
            entries.append(
                {
                    "filename": filename,
                    "subfolder": subfolder,
                    "type": kind,
                    "format": inputs.get("format", "video/h264-mp4"),
                    "frame_rate": inputs.get("frame_rate", 8.0),
                    "workflow": f"{base}_{counter:05}.png",
                    "fullpath": f"/comfyui/{kind}/{posixpath.join(subfolder, filename)}",
                }
            )
        else:
            filename = f"{base}_{counter:05}_.{extension}"
            entries.append({"filename": filename, "subfolder": subfolder, "type": kind})
        files.append((kind, subfolder, filename))
    ui: dict[str, Any] = {cls.output or "images": entries}
    if cls.animated:
        ui["animated"] = [True]
    return ui, files


def _extension(cls: NodeClass, inputs: dict[str, Any]) -> str:
    fmt = str(inputs.get("format", ""))
    if cls.output == "gifs" and "/" in fmt:
        return {"h264-mp4": "mp4", "gif": "gif", "webp": "webp", "webm": "webm"}.get(
            fmt.split("/")[1], "mp4"
        )
    if fmt in ("mp4", "webm"):
        return fmt
    return cls.extension
