def pytest_addoption(parser):
    parser.addoption("--update", action="store_true", default=False,
                     help="rewrite tests/golden/metrics.prom and signals.txt from this run")
