"""Safety taxonomy track: paraphrase and image-removal predictions, quadrants, statistics."""
