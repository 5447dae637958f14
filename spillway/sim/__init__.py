"""Simulators of ComfyUI, MiniMax and the A40 guard (tests and `spillway dev --simulate`)."""
