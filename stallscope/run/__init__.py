"""``stallscope run -- python train.py``: one machine, no root, no Prometheus."""
