"""Scene tools: synthetic scenes (odin-synth) and the city generator the benchmarks use."""
