"""TPU pod slices from this machine: Cloud TPU names (slices), the steps compiled for a slice (aot), and
what a compiled program communicates (hlo)."""
