"""The model: how it loads (``modeling``), its LoRA targets (``lora``) and adapters
(``adapters``), how it samples and scores tokens (``sampling``), and how much memory it
needs (``shape`` -> ``footprint`` -> ``memory``). Serving and training both build on it."""
