"""spillway: a durable router for ComfyUI video jobs; local GPUs first, paid cloud by consent."""
