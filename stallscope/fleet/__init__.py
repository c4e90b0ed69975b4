"""The cluster's jobs over a period, from Prometheus alone (issue 36): ``stallscope top``."""
