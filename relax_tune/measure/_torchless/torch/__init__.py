# Found first on the path of relax_tune's build, run and replay workers only (worker_pool.py):
# they never use PyTorch, and TVM's FFI imports it whenever it is installed (2.5 s and 260 MB
# per worker). Anything that does import torch in such a worker learns why at once.
raise ImportError("relax_tune's measurement workers run without PyTorch "
                  "(relax_tune/measure/worker_pool.py)")
