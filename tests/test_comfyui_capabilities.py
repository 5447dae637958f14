"""What a host can run (activities/comfyui/capabilities.py), read off the recorded
`GET /object_info` of a real ComfyUI 0.3.64 (tests/comfyui_transcripts/object_info_excerpt.json):
both forms of a list input, lists filled at run time, and a graph matched against it the way
ComfyUI's own validation would refuse it (post_prompt_node_missing_on_host,
post_prompt_value_not_in_list)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.comfyui.answers import MalformedAnswer
from activities.comfyui.capabilities import Capabilities, capabilities, graph_shape, model_files
from activities.comfyui.client import ComfyUIClient
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.comfyui_graph import Host
from tests.support.graphs import GRAIN_GRAPH, VIDEO_GRAPH

TRANSCRIPTS = Path(__file__).resolve().parent / "comfyui_transcripts"
READ_AT = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def recorded(name: str) -> Any:
    return json.loads((TRANSCRIPTS / f"{name}.json").read_text())["body"]


@pytest.fixture
def host_b() -> Capabilities:
    """The recorded host: it has the custom node FilmGrainLite and one checkpoint."""
    return capabilities(recorded("object_info_excerpt"), READ_AT)


@pytest.fixture
def host_a(host_b: Capabilities) -> Capabilities:
    """The same ComfyUI without the custom node and without the checkpoint."""
    nodes = {cls: dict(inputs) for cls, inputs in host_b.nodes.items() if cls != "FilmGrainLite"}
    nodes["CheckpointLoaderSimple"]["ckpt_name"] = []
    return Capabilities(nodes=nodes, read_at=READ_AT)


def test_list_inputs_in_both_forms_and_lists_filled_at_run_time_are_told_apart(host_b):
    nodes = host_b.nodes
    assert set(nodes) == set(recorded("object_info_excerpt"))
    assert nodes["CheckpointLoaderSimple"] == {"ckpt_name": ["only-on-b.safetensors"]}  # legacy
    assert nodes["LatentConcat"] == {"dim": ["x", "-x", "y", "-y", "t", "-t"]}  # COMBO
    assert nodes["UNETLoader"]["unet_name"] == []  # a model folder with no file in it
    assert nodes["FilmGrainLite"] == {"grain": ["fine", "coarse"]}
    # Not checked: the files uploaded so far (spillway uploads a job's own), a remote route.
    assert nodes["LoadImage"] == {"image": None}
    assert nodes["LoadImageOutput"] == {"image": None}
    # Inputs that are not lists (numbers, strings, links) are not kept.
    assert "width" not in nodes["EmptyImage"] and "seed" not in nodes["KSampler"]


GRAIN = GRAIN_GRAPH


def test_a_graph_runs_where_its_nodes_and_values_are_and_is_refused_by_name_elsewhere(
    host_a, host_b
):
    assert host_b.missing(GRAIN) == []
    # As ComfyUI refuses it there: "Cannot execute because node FilmGrainLite does not exist."
    assert host_a.missing(GRAIN) == ["node FilmGrainLite (#3) is not installed"]
    heavy = GRAIN | {"3": {"class_type": "FilmGrainLite", "inputs": {"grain": "heavy"}}}
    # As ComfyUI refuses it: value_not_in_list, "grain: 'heavy' not in ['fine', 'coarse']".
    assert host_b.missing(heavy) == ["FilmGrainLite.grain 'heavy' (#3) is not offered"]


def test_a_model_file_only_one_host_has_counts_where_an_output_depends_on_it():
    checkpoint = {"ckpt_name": "only-on-b.safetensors"}
    graph = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": checkpoint},
        "5": {"class_type": "LoadImage", "inputs": {"image": "spillway/not-uploaded-yet.png"}},
        # The match follows links, not their types: the output depends on both.
        "2": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["5", 0], "x": ["4", 0]}},
    }
    b = capabilities(recorded("object_info_excerpt"), READ_AT)
    a = b.model_copy(update={"nodes": b.nodes | {"CheckpointLoaderSimple": {"ckpt_name": []}}})
    # Not the uploaded image: spillway uploads a job's inputs itself, after the match.
    assert b.missing(graph) == []
    assert a.missing(graph) == [
        "CheckpointLoaderSimple.ckpt_name 'only-on-b.safetensors' (#4) is not offered"
    ]
    # A node no output depends on is neither checked nor run by ComfyUI.
    unlinked = graph | {"2": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["5", 0]}}}
    assert a.missing(unlinked) == []


def test_the_model_files_a_graph_loads_are_the_values_that_name_one():
    graph = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_14B.safetensors"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "3": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl.GGUF", "type": "wan"}},
        "4": {"class_type": "KSampler", "inputs": {"sampler_name": "euler", "model": ["1", 0]}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat.safetensors, walking"}},
        "6": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
    }
    assert model_files(graph) == [
        "umt5_xxl.GGUF",
        "wan2.2_t2v_14B.safetensors",
        "wan_2.1_vae.safetensors",
    ]
    assert model_files({"1": "not a node", "2": {"inputs": None}}) == []


def test_a_graph_s_shape_ignores_seeds_and_prompts_and_follows_its_size_and_models():
    shape = graph_shape(VIDEO_GRAPH)
    assert len(shape) == 16
    other_colour = copy.deepcopy(VIDEO_GRAPH)
    other_colour["1"]["inputs"]["color"] = 99  # like a seed or a prompt: the same render
    assert graph_shape(other_colour) == shape
    longer = copy.deepcopy(VIDEO_GRAPH)
    longer["1"]["inputs"]["batch_size"] = 81  # 81 frames, not 4
    assert graph_shape(longer) != shape
    other_model = VIDEO_GRAPH | {
        "9": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_14B.safetensors"}}
    }
    assert graph_shape(other_model) != shape


def test_an_answer_that_is_not_a_map_of_node_classes_is_malformed_and_odd_specs_are_skipped():
    with pytest.raises(MalformedAnswer):
        capabilities(["not", "object_info"], READ_AT)
    odd = {"A": "not a spec", "B": {"input": {"required": {"x": [[1, 2.5, True, None]], "y": []}}}}
    found = capabilities(odd, READ_AT)
    assert found.nodes == {"A": {}, "B": {"x": [1, 2.5, True]}} and found.outputs == set()
    assert found.missing({"9": {"class_type": "B", "inputs": {"x": 1}}, "8": "odd"}) == [
        "node ? (#8) is not installed"
    ]


async def test_what_the_double_says_it_has_predicts_what_it_refuses(comfyui: ComfyUISim):
    """Read as the agent will read a host (`GET /object_info`): a graph the match finds runnable
    is accepted, one it finds lacking is refused, on a host with and one without the custom
    node."""
    graph = GRAIN_ON_A_CHECKPOINT
    async with httpx.AsyncClient() as http:
        client = ComfyUIClient(http, comfyui.url)
        lacking = await client.capabilities()
        # The checkpoint feeds no output: ComfyUI neither checks nor loads it.
        assert lacking.missing(graph) == ["node FilmGrainLite (#3) is not installed"]
        refused = await http.post(f"{comfyui.url}/prompt", json={"prompt": graph})
        assert refused.status_code == 400
        comfyui.installed = Host(
            nodes=Host().nodes | {"FilmGrainLite"},
            models={"checkpoints": ("only-on-b.safetensors",)},
        )
        having = await client.capabilities()
        assert having.missing(graph) == [] and having.read_at >= lacking.read_at
        accepted = await http.post(f"{comfyui.url}/prompt", json={"prompt": graph})
        assert accepted.status_code == 200 and accepted.json()["node_errors"] == {}


GRAIN_ON_A_CHECKPOINT = GRAIN_GRAPH | {
    "4": {
        "class_type": "CheckpointLoaderSimple",
        "inputs": {"ckpt_name": "only-on-b.safetensors"},
    }
}
