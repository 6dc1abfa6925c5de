"""The pre-trained cost model's pipeline: measure a corpus of candidates on this CPU
(``make_corpus``), read it or keep it as a table (``corpus``, tables in ``corpus_tables/``),
train the model shipped in ``relax_tune/cost_model/pretrained/`` (``train_prior``), and check
what it is worth on held-out workloads (``evaluate_prior``, ``simulate_tuning``). Run each as a
module from the repository root, e.g. ``python -m tools.prior.train_prior --help``."""
