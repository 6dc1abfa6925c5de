"""Small models built in code for the tests, the benchmarks and the corpus: not part of the
tuner's API, shipped so that ``relax-tune tune relax_tune.testing.models:NAME`` works on a
fresh install."""
