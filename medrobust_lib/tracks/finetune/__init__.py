"""Fine-tuning strategies: training per strategy, ranking, registry evaluation, gate."""
