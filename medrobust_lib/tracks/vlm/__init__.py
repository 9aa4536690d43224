"""Vision-language track: VQA, captioning, grounding predictions and their statistics."""
