"""Activities: everything that touches the world (ComfyUI, NVML, the guard, MiniMax)."""
