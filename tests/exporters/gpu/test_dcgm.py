"""dcgm-exporter reader against exposition written from dcgm-exporter's documented
format (README, etc/default-counters.csv, etc/dcp-metrics-included.csv) with its real
label sets, served over real HTTP."""
import pytest

from stallscope.exporters.gpu.dcgm import DcgmReader, parse
from tests.helpers.gpu import DcgmServer, fixture


def test_sm_active_then_gr_engine_then_gpu_util_per_gpu():
    got = {uuid: r for (uuid, gpu), r in parse(fixture("dcgm-exporter-k8s.txt")).items()}
    g0, g1, g2, g3 = (got[u] for u in sorted(got, key=lambda u: got[u].gpu))
    assert (g0.gpu, g0.field, g0.value) == ("0", "DCGM_FI_PROF_SM_ACTIVE", 0.812345)
    assert (g0.namespace, g0.pod, g0.container) == ("ml-team", "llm-pretrain-worker-0", "trainer")
    assert g0.model == "NVIDIA H100 80GB HBM3"
    # SM_ACTIVE holds DCGM's FP64 "not supported" sentinel: fall back to GR_ENGINE_ACTIVE.
    assert (g1.field, g1.value) == ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.443105)
    # No profiling fields at all (and no pod): GPU_UTIL in percent.
    assert (g2.field, g2.value, g2.pod) == ("DCGM_FI_DEV_GPU_UTIL", 0.37, "")
    # One busy SM keeps GPU_UTIL at 100 % while SM_ACTIVE shows the truth.
    assert (g3.field, g3.value) == ("DCGM_FI_PROF_SM_ACTIVE", 0.002117)


def test_default_counters_of_an_older_build():
    (r,) = parse(fixture("dcgm-exporter-default.txt")).values()
    assert (r.uuid, r.gpu, r.field, r.value, r.pod) == (
        "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52", "0", "DCGM_FI_DEV_GPU_UTIL", 0.0, "")


def test_mig_instances_are_separate():
    got = parse(fixture("dcgm-exporter-mig.txt"))
    assert sorted((k[1], r.value, r.pod) for k, r in got.items()) == [
        ("0:1", 0.7, "infer-a"), ("0:2", 0.02, "infer-b")]


@pytest.fixture
def dcgm_server():
    s = DcgmServer(fixture("dcgm-exporter-k8s.txt"))
    yield s
    s.close()


def test_reader_records_each_collection_once_and_reports_an_outage(dcgm_server):
    seen, logs = [], []
    r = DcgmReader(dcgm_server.url, on_readings=lambda readings, t: seen.append(len(readings)),
                   log=logs.append)
    r.poll()
    r.poll()  # dcgm-exporter has not collected again: same values
    assert r.up and seen == [4] and r.collections == 1
    assert len([m for m in logs if "using DCGM_FI_PROF_GR_ENGINE_ACTIVE" in m]) == 1
    dcgm_server.body = dcgm_server.body.replace("0.812345", "0.5")  # a new collection
    r.poll()
    assert seen == [4, 4]
    dcgm_server.close()
    r.poll()
    r.poll()
    up, readings = r.snapshot()
    assert not up and readings == {} and r.errors["fetch"] == 2
    assert len([m for m in logs if "not reachable" in m]) == 1


def test_an_endpoint_without_gpu_fields_is_down(dcgm_server):
    dcgm_server.body = "# TYPE go_goroutines gauge\ngo_goroutines 12\n"
    logs = []
    r = DcgmReader(dcgm_server.url, log=logs.append)
    r.poll()
    assert not r.up and "reports none of" in r.reason and len(logs) == 1
