"""spillway: a durable router for ComfyUI video jobs; local A40 first, paid cloud by consent."""
