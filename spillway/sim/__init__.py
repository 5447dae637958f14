"""Simulators of ComfyUI, MiniMax, Kling and the A40 guard (tests and `spillway dev --simulate`)."""
