"""Cost: measuring time, FLOPs and memory of a model (measure, memory) and fitting how they
scale with sequence length (fit)."""
