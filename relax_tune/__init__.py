"""relax_tune: a search-based auto-tuner for TVM Relax pipelines."""
