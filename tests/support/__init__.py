"""Helpers the tests share; tests/conftest.py loads the modules that hold fixtures.

- constants: figures named for what they are (FREE_VRAM_PCT, BUSY_VRAM_PCT, CLIP_USD,
  CANARY_KEY, TEST_KEY).
- settings: the one Settings factory (`make_settings`) and its layers (QUIET, KEY, ARMED, the
  ComfyUI and MiniMax doubles' values); fixtures `comfyui_settings`, `minimax_settings`.
- graphs: ComfyUI graphs as plain data (VIDEO_GRAPH, ANIMATION_GRAPH, SLOW_GRAPH,
  `graph_without`); the benchmarks use them too.
- comfyui: the ComfyUI double (`comfyui`), request builders, `comfyui_activities`.
- a40: the guard double (`guard`) and injected NVML readings (`FakeGpu`, `gpu`).
- minimax: the MiniMax double (`minimax`), `FAST` timing, `BookLedger`, `minimax_activities`.
- kling: the Kling double (`kling`, canary keys CANARY_ACCESS / CANARY_SECRET), `FAST` timing,
  `kling_settings`, `kling_activities`, `KlingBookLedger` (reserves a job for Kling).
- images: input images made without an image library (`png`, `jpeg`, `webp`, `gif` of a given
  size) and `I2V_GRAPH`, an image-to-video graph with one LoadImage.
- activity: `run_activity`, one activity in an ActivityEnvironment, heartbeats collected.
- waiting: `until`, the one polling wait.
- jobs: `Jobs`, the one job client (start, status, until a state), and the in-process runner
  (`run_jobs`, `run_dev_jobs`) with the route stand-ins of route_stubs.
- route_stubs: same-named stand-ins of the probe and the route activities, counting calls.
- workflows, callback_workflow: tiny workflows running one route's activities (through
  workflows/activity_calls.py) or the completion callback.
- cli: the `spillway` and `temporal` commands, free ports, decoded payloads.
- worker_process: `python worker.py` as a process a test kills and restarts (`worker_process`).
- s3: moto's S3 server (`s3`).
"""
