import pytest

from stallscope.hook import identity


@pytest.mark.parametrize("env,expect", [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "llm-7b"},
     {"rank": 3, "local_rank": 1, "world_size": 8, "job": "llm-7b"}),
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "2", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "123456"},
     {"rank": 5, "local_rank": 2, "world_size": 16, "job": "123456"}),
    # torchrun wins over Slurm when both are present (torchrun inside an sbatch job)
    ({"RANK": "1", "SLURM_PROCID": "0", "TORCHELASTIC_RUN_ID": "r", "SLURM_JOB_ID": "9"},
     {"rank": 1, "job": "r"}),
    # an explicit job name wins; torchrun's default run id "none" names nothing
    ({"STALLSCOPE_JOB": "mine", "TORCHELASTIC_RUN_ID": "abc"}, {"job": "mine"}),
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}, {"job": "77"}),
    ({}, {"rank": 0, "local_rank": 0, "world_size": 1, "job": "default"}),
    ({"RANK": "not-a-number"}, {"rank": 0}),
    ({"POD_NAME": "trainer-0", "POD_NAMESPACE": "ml", "NODE_NAME": "gpu-7", "HOSTNAME": "x"},
     {"pod": "trainer-0", "namespace": "ml", "node": "gpu-7"}),
    ({"HOSTNAME": "trainer-1"}, {"pod": "trainer-1"}),
])
def test_detect(env, expect):
    got = identity.detect(env)
    for k, v in expect.items():
        assert got[k] == v, (k, got)
    assert set(got) == set(identity.FIELDS)


def test_overrides_are_typed():
    got = identity.detect({"RANK": "1"}, rank="4", world_size=8, job=12, pod=None)
    assert got["rank"] == 4 and got["world_size"] == 8 and got["job"] == "12"
    assert got["pod"]  # None override keeps the detected value
