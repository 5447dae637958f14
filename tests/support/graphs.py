"""ComfyUI graphs as its "Export (API)" writes them, plain data (the benchmarks use them too):
`VIDEO_GRAPH` (EmptyImage -> CreateVideo -> SaveVideo, an mp4 under "images" with "animated";
the recorded transcripts' model-free graph), `ANIMATION_GRAPH` (SaveAnimatedWEBP),
`SLOW_GRAPH` (a blur chain: several node boundaries to interrupt at), `GRAIN_GRAPH` (a custom
node some hosts lack); `graph_without` breaks one by taking out an input."""

from __future__ import annotations

import copy
from typing import Any

VIDEO_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 4, "color": 7},
    },
    "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
    "3": {
        "class_type": "SaveVideo",
        "inputs": {
            "video": ["2", 0],
            "filename_prefix": "video/job",
            "format": "mp4",
            "codec": "h264",
        },
    },
}

ANIMATION_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 8, "color": 7586251},
    },
    "2": {
        "class_type": "SaveAnimatedWEBP",
        "inputs": {
            "images": ["1", 0],
            "filename_prefix": "anim/orch",
            "fps": 8.0,
            "lossless": False,
            "quality": 80,
            "method": "default",
        },
    },
}

SLOW_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 768, "height": 768, "batch_size": 32, "color": 3442609},
    },
    **{
        str(n): {
            "class_type": "ImageBlur",
            "inputs": {
                "image": [str(n - 1) if n > 10 else "1", 0],
                "blur_radius": 31,
                "sigma": 10.0,
            },
        }
        for n in (10, 11, 12)
    },
    "2": {
        "class_type": "SaveAnimatedWEBP",
        "inputs": {
            "images": ["12", 0],
            "filename_prefix": "slow/s",
            "fps": 8.0,
            "lossless": False,
            "quality": 50,
            "method": "fastest",
        },
    },
}


def graph_without(graph: dict[str, Any], node_id: str, input_name: str) -> dict[str, Any]:
    broken = copy.deepcopy(graph)
    del broken[node_id]["inputs"][input_name]
    return broken


# The custom node FilmGrainLite as node 3 between an image and its output, node 2: as the
# rejections in post_prompt_node_missing_on_host.json and post_prompt_value_not_in_list.json
# name them (a host without the node; a grain it does not offer).
GRAIN_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0},
    },
    "3": {"class_type": "FilmGrainLite", "inputs": {"images": ["1", 0], "grain": "fine"}},
    "2": {
        "class_type": "SaveAnimatedWEBP",
        "inputs": {
            "images": ["3", 0],
            "filename_prefix": "grain",
            "fps": 6.0,
            "lossless": True,
            "quality": 80,
            "method": "default",
        },
    },
}
