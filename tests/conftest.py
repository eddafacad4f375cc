import os

# Keep compiler by-products of the test run out of other runs' way.
os.environ.setdefault("CSAGATE_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..",
                                                         ".csagate-cache"))
