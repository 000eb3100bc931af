"""`--ray` on a simulated cluster of two nodes on this machine (ray.cluster_utils.Cluster), each offering one
model slot as a custom resource: both nodes run a model actor, and the rows say which node ran each photo."""

import shutil

import pytest
from test_cli import ASSETS, run_cli

from sapiens2.cli import EXIT_OK

pytest.importorskip("ray.data", reason="the scale extra (requirements-scale.txt) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"model_slot": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"model_slot": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_both_nodes_run_model_actors(two_nodes, small_mirror, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for index in range(8):
        shutil.copy(ASSETS / ("grace_hopper.jpg" if index % 2 else "astronaut.png"), folder / f"p{index}.png")
    out = tmp_path / "out"
    status, printed = run_cli(
        "segment",
        folder,
        "--out",
        out,
        "--ray",
        "--actors",
        "2,2",
        "--actor-resources",
        "model_slot=1",
        "--checkpoint-dir",
        small_mirror,
        "--device",
        "cpu",
        "--batch-size",
        1,
        "--exports",
        "npy",
    )
    assert status == EXIT_OK, printed
    rows = pq.read_table(out / "predictions/segment").to_pandas()
    assert sorted(rows["stem"]) == [f"p{index}" for index in range(8)]
    nodes = {node for row in rows["nodes"] for node in row}
    assert nodes == {node["NodeID"] for node in ray.nodes() if node["Alive"]} and len(nodes) == 2
    assert "model stages ran on 2 nodes" in printed and "2 nodes, 2 CPUs" in printed
