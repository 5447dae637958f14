"""What a GPU host's ComfyUI can run (issue 46; DESIGN.md's ComfyUI facts, "What a host can run"):
its node classes and the options of their list inputs, read off `GET /object_info` and kept as
only what matching a graph needs (the answer is ~500 KB for a vanilla ComfyUI 0.3.64, more with
custom nodes: it never enters a workflow history), and a graph matched against them. Pure, tested
on the recorded transcripts in tests/comfyui_transcripts/.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from activities.comfyui.answers import MalformedAnswer
from spillway.core.gpu_pool import MAX_MODELS, MAX_SHAPE
from spillway.core.models import HostCapabilities

Option = str | int | float | bool
MAX_OPTION = 255  # characters: a model file's or a sampler's name, never a prompt's text
# The endings of the files ComfyUI lists in its model folders (folder_paths'
# supported_pt_extensions, and .gguf of the widely used GGUF loaders).
MODEL_ENDINGS = (".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft", ".gguf")


class Capabilities(BaseModel):
    """One host's node classes, each with its list inputs and their options. An input's
    options are None where ComfyUI fills the list at run time (a remote route) or it lists only
    uploaded files (`image_upload`: spillway uploads a job's inputs itself, after matching):
    never checked."""

    nodes: dict[str, dict[str, list[Option] | None]]
    outputs: set[str] = set()  # the classes that are output nodes: what ComfyUI runs toward
    models: dict[str, list[str]] = {}  # the files of each model folder (`GET /models/{folder}`)
    read_at: datetime

    def brief(self) -> HostCapabilities:
        return HostCapabilities(
            nodes=len(self.nodes),
            models={folder: len(files) for folder, files in self.models.items()},
            read_at=self.read_at,
        )

    def missing(self, graph: dict[str, Any]) -> list[str]:
        """What `graph` (API format) needs that this host lacks, one phrase each: a node class
        it does not have (anywhere in the graph), or a value a list input does not offer there
        (on a node an output depends on: ComfyUI checks and runs no other). Empty: it can run
        it. A link to another node's output (`[node id, index]`) is not a value."""
        absent: dict[str, list[str]] = {}
        for node_id, node in graph.items():
            cls = str(node.get("class_type")) if isinstance(node, dict) else "?"
            if cls not in self.nodes:
                absent.setdefault(cls, []).append(f"#{node_id}")
        unoffered: list[str] = []
        for node_id in self._run(graph):
            node = graph[node_id]
            inputs = self.nodes.get(str(node.get("class_type")))
            if inputs is None:
                continue
            cls = str(node.get("class_type"))
            given = node.get("inputs")
            for name, value in (given if isinstance(given, dict) else {}).items():
                options = inputs.get(name)
                if options is None or _is_link(value):
                    continue
                if value not in options:
                    unoffered.append(f"{cls}.{name} {value!r} (#{node_id}) is not offered")
        return [
            *(f"node {cls} ({', '.join(ids)}) is not installed" for cls, ids in absent.items()),
            *unoffered,
        ]

    def _run(self, graph: dict[str, Any]) -> list[str]:
        """The nodes ComfyUI would run: the output nodes and every node they depend on."""
        ran: list[str] = []
        todo = [i for i, n in graph.items() if isinstance(n, dict) and self._output(n)]
        while todo:
            node_id = todo.pop()
            if node_id in ran or not isinstance(graph.get(node_id), dict):
                continue
            ran.append(node_id)
            given = graph[node_id].get("inputs")
            values = given.values() if isinstance(given, dict) else []
            todo += [str(v[0]) for v in values if _is_link(v)]
        return sorted(ran)

    def _output(self, node: dict[str, Any]) -> bool:
        return node.get("class_type") in self.outputs


def needs(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What matching reads of a graph, small enough for an activity's input: each node's class,
    its links and its short scalar values (a prompt's text, longer than any option, is left out)."""
    kept: dict[str, dict[str, Any]] = {}
    for node_id, node in graph.items():
        if not isinstance(node, dict):
            continue
        given = node.get("inputs")
        inputs = {
            name: value
            for name, value in (given if isinstance(given, dict) else {}).items()
            if _is_link(value) or (isinstance(value, Option) and len(str(value)) <= MAX_OPTION)
        }
        kept[str(node_id)] = {"class_type": node.get("class_type"), "inputs": inputs}
    return kept


def model_files(graph: dict[str, Any]) -> list[str]:
    """The model files a graph loads (the values its loaders are given), sorted: what a host
    that ran it last has warm. At most MAX_MODELS, each at most MAX_OPTION characters."""
    found = {
        value
        for node in graph.values()
        if isinstance(node, dict) and isinstance(given := node.get("inputs"), dict)
        for value in given.values()
        if isinstance(value, str)
        and len(value) <= MAX_OPTION
        and value.lower().endswith(MODEL_ENDINGS)
    }
    return sorted(found)[:MAX_MODELS]


# Inputs whose values make one render of a graph much longer than another (a clip's frames, its
# size, the sampler's steps); seeds and prompts do not.
SHAPE_INPUTS = frozenset(
    {"width", "height", "length", "frames", "num_frames", "video_frames", "batch_size", "steps"}
)


def graph_shape(graph: dict[str, Any]) -> str:
    """What kind of render a graph is, for the GPU line's estimate (a 14B video render is not a
    2 s test image): a short hash of its node classes, the model files it loads and its
    SHAPE_INPUTS values. Graphs that differ only in seeds or prompts have one shape."""
    classes = sorted(
        str(node.get("class_type")) for node in graph.values() if isinstance(node, dict)
    )
    sizes = sorted(
        f"{node.get('class_type')}.{name}={value}"
        for node in graph.values()
        if isinstance(node, dict) and isinstance(given := node.get("inputs"), dict)
        for name, value in given.items()
        if name in SHAPE_INPUTS and isinstance(value, int | float)
    )
    text = json.dumps([classes, model_files(graph), sizes])
    return hashlib.sha256(text.encode()).hexdigest()[:MAX_SHAPE]


def capabilities(
    answer: Any, read_at: datetime, models: dict[str, list[str]] | None = None
) -> Capabilities:
    """`GET /object_info`'s answer, as matching needs it (with `models`, the files of each model
    folder). MalformedAnswer when it is not a map of node classes (a proxy's page, another
    server)."""
    if not isinstance(answer, dict):
        raise MalformedAnswer(f"GET /object_info answered {type(answer).__name__}, not a map")
    nodes: dict[str, dict[str, list[Option] | None]] = {}
    outputs = set()
    for cls, spec in answer.items():
        if isinstance(spec, dict) and spec.get("output_node") is True:
            outputs.add(str(cls))
        declared = spec.get("input") if isinstance(spec, dict) else None
        inputs: dict[str, list[Option] | None] = {}
        for section in ("required", "optional"):
            named = declared.get(section) if isinstance(declared, dict) else None
            for name, input_spec in (named if isinstance(named, dict) else {}).items():
                if _is_list(input_spec):
                    inputs[str(name)] = _options(input_spec)
        nodes[str(cls)] = inputs
    return Capabilities(nodes=nodes, outputs=outputs, models=models or {}, read_at=read_at)


def _is_list(spec: Any) -> bool:
    """A list input: `[[option, ...], {...}]` (the legacy form) or `["COMBO", {...}]`."""
    return (
        isinstance(spec, list) and bool(spec) and (isinstance(spec[0], list) or spec[0] == "COMBO")
    )


def _options(spec: list[Any]) -> list[Option] | None:
    extra = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if extra.get("image_upload") or "remote" in extra:
        return None
    listed = spec[0] if isinstance(spec[0], list) else extra.get("options")
    if not isinstance(listed, list):
        return None  # a COMBO without options: filled at run time
    return [o for o in listed if isinstance(o, str | int | float | bool)]


def _is_link(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    )
